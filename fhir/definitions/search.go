package definitions

import (
	"bytes"
	"encoding/json"
	"sort"
	"sync"

	"github.com/sandbot/sandbot/fhir"
)

// typeIndex holds the index values of every definition of a type, computed
// on the first search of the type (decoding them all: about 0.2 s for the
// StructureDefinitions).
type typeIndex struct {
	once   sync.Once
	values [][]fhir.IndexValue // by position in byType
	heads  []fhir.Resource     // id and meta, for _id and _lastUpdated
	err    error
}

func (s *Set) typeIndex(typ string) (*typeIndex, error) {
	v, _ := s.index.LoadOrStore(typ, &typeIndex{})
	ti := v.(*typeIndex)
	ti.once.Do(func() {
		for _, r := range s.byType[typ] {
			res, err := decode(r.JSON)
			if err != nil {
				ti.err = err
				return
			}
			ti.values = append(ti.values, fhir.Extract(res))
			ti.heads = append(ti.heads, fhir.Resource{"resourceType": typ, "id": r.ID, "meta": res["meta"]})
		}
	})
	return ti, ti.err
}

func decode(b []byte) (fhir.Resource, error) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return fhir.Resource(m), nil
}

// Page is one page of a search of the definitions.
type Page struct {
	Resources []*Resource
	// Total is the number of matches (always counted: the set is small).
	Total int
	More  bool
}

// Search answers a search of one of the served types, with the semantics
// of the store's (fhir.MatchInMemory): filters, _filter, _sort, paging.
// Without _sort the package's order is kept.
func (s *Set) Search(req *fhir.SearchRequest) (*Page, error) {
	if page, ok := s.lookup(req); ok {
		return page, nil
	}
	ti, err := s.typeIndex(req.ResourceType)
	if err != nil {
		return nil, err
	}
	list := s.byType[req.ResourceType]
	var hits []int
	for i := range list {
		ok, err := fhir.MatchInMemory(req, ti.heads[i], ti.values[i])
		if err != nil {
			return nil, err
		}
		if ok {
			hits = append(hits, i)
		}
	}
	if len(req.Sort) > 0 {
		sort.SliceStable(hits, func(a, b int) bool { return less(req.Sort, list, ti, hits[a], hits[b]) })
	}
	page := &Page{Total: len(hits)}
	lo := min(req.Offset, len(hits))
	hi := min(lo+req.Count, len(hits))
	page.More = hi < len(hits)
	for _, i := range hits[lo:hi] {
		page.Resources = append(page.Resources, list[i])
	}
	return page, nil
}

// lookup answers the searches clients make most, one url or one id, from
// the loaded index, without decoding the type's definitions.
func (s *Set) lookup(req *fhir.SearchRequest) (*Page, bool) {
	if len(req.Filters) != 1 || len(req.Expr) > 0 || len(req.AnyOf) > 0 || len(req.Sort) > 0 || req.Offset > 0 {
		return nil, false
	}
	f := req.Filters[0]
	if f.Modifier != "" || f.Chain != nil || len(f.Values) != 1 || !(f.Param.Code == "url" && f.Param.Type == fhir.URIParam || f.Param.Code == "_id") {
		return nil, false
	}
	var r *Resource
	var found bool
	if f.Param.Code == "url" {
		r, found = s.byURL[req.ResourceType+" "+f.Values[0].Code]
	} else {
		r, found = s.Read(req.ResourceType, f.Values[0].Code)
	}
	page := &Page{}
	if found {
		page.Total = 1
		if req.Count > 0 {
			page.Resources = []*Resource{r}
		}
	}
	return page, true
}

func less(rules []fhir.SortRule, list []*Resource, ti *typeIndex, a, b int) bool {
	for _, rule := range rules {
		c := 0
		switch {
		case rule.Param != nil:
			ka, na, oka := fhir.SortKey(rule, ti.values[a])
			kb, nb, okb := fhir.SortKey(rule, ti.values[b])
			switch {
			case oka != okb: // resources without a value come last
				if oka {
					return true
				}
				return false
			case ka != kb:
				c = compare(ka < kb)
			case na != nb:
				c = compare(na < nb)
			}
		case rule.Column == "id":
			if list[a].ID != list[b].ID {
				c = compare(list[a].ID < list[b].ID)
			}
		}
		if c != 0 {
			if rule.Descending {
				return c > 0
			}
			return c < 0
		}
	}
	return false
}

func compare(less bool) int {
	if less {
		return -1
	}
	return 1
}
