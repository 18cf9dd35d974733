package fhirapi_test

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
)

// TestSearchBundleShape checks the searchset Bundle against the reference:
// no id or meta, absolute fullUrls and links, total only on request, the
// default and maximum page sizes, paging and sorting.
func TestSearchBundleShape(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "shape")
		var created []string // in creation (= _lastUpdated) order
		for i := range 25 {
			p := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": fmt.Sprintf("Shape%02d", i)}}})
			created = append(created, str(p, "id"))
		}
		base := s.URL + "fhir/R4/Patient"

		r := c.Do("GET", "fhir/R4/Patient?name=shape", nil, "")
		if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/fhir+json") {
			t.Fatalf("search: %d %s %.200s", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
		b := r.JSON()
		var keys []string
		for k := range b {
			keys = append(keys, k)
		}
		if want := []string{"entry", "link", "resourceType", "type"}; !slices.Equal(sorted(keys), want) {
			t.Errorf("Bundle keys %v, want %v (no id, meta or total)", sorted(keys), want)
		}
		if b["resourceType"] != "Bundle" || b["type"] != "searchset" {
			t.Errorf("Bundle: %v %v", b["resourceType"], b["type"])
		}
		es := entries(t, r)
		if len(es) != 20 {
			t.Fatalf("default page: %d entries, want 20", len(es))
		}
		for i, e := range es {
			id := str(e, "resource", "id")
			if got, want := str(e, "fullUrl"), base+"/"+id; got != want {
				t.Errorf("entry %d fullUrl %q, want %q", i, got, want)
			}
			if str(e, "search", "mode") != "match" {
				t.Errorf("entry %d search %v", i, e["search"])
			}
			if str(e, "resource", "resourceType") != "Patient" || str(e, "resource", "meta", "versionId") == "" {
				t.Errorf("entry %d resource %v", i, e["resource"])
			}
		}
		// The default order is _lastUpdated ascending.
		if got := entryIDs(t, r); !slices.Equal(got, created[:20]) {
			t.Errorf("default order:\n got %v\nwant %v", got, created[:20])
		}
		l := links(t, r)
		if got, want := sorted(keysOf(l)), []string{"first", "next", "self"}; !slices.Equal(got, want) {
			t.Errorf("first page links %v, want %v", got, want)
		}
		for rel, u := range l {
			if !strings.HasPrefix(u, base+"?") {
				t.Errorf("link %s %q is not absolute under %s?", rel, u, base)
			}
		}
		checkQuery(t, "self", l["self"], map[string]string{"name": "shape", "_count": "20", "_offset": ""})
		checkQuery(t, "next", l["next"], map[string]string{"name": "shape", "_count": "20", "_offset": "20"})
		checkQuery(t, "first", l["first"], map[string]string{"name": "shape", "_count": "20", "_offset": ""})

		// Following next gives the last 5 and previous/first, no next.
		next := c.Do("GET", strings.TrimPrefix(l["next"], s.URL), nil, "")
		if got := entryIDs(t, next); !slices.Equal(got, created[20:]) {
			t.Errorf("second page: %v, want %v", got, created[20:])
		}
		l2 := links(t, next)
		if got, want := sorted(keysOf(l2)), []string{"first", "previous", "self"}; !slices.Equal(got, want) {
			t.Errorf("last page links %v, want %v", got, want)
		}
		checkQuery(t, "previous", l2["previous"], map[string]string{"_count": "20", "_offset": ""})

		for _, tc := range []struct {
			what, query string
			want        []string // ids in order; nil to skip
			n           int
			total       any // nil: absent
			links       []string
			self        map[string]string
		}{
			{"_total=accurate", "name=shape&_total=accurate", created[:20], 20, float64(25), []string{"first", "next", "self"}, map[string]string{"_total": "accurate"}},
			{"_total=none", "name=shape&_total=none", nil, 20, nil, []string{"first", "next", "self"}, nil},
			{"_count=5000 is clamped", "name=shape&_count=5000", created, 25, nil, []string{"first", "self"}, map[string]string{"_count": "1000"}},
			{"_count=1000", "name=shape&_count=1000", created, 25, nil, []string{"first", "self"}, map[string]string{"_count": "1000"}},
			{"_count=5", "name=shape&_count=5", created[:5], 5, nil, []string{"first", "next", "self"}, map[string]string{"_count": "5"}},
			{"_count=0", "name=shape&_count=0&_total=accurate", nil, 0, float64(25), []string{"self"}, map[string]string{"_count": "0"}},
			{"_offset", "name=shape&_count=10&_offset=10", created[10:20], 10, nil, []string{"first", "next", "previous", "self"}, map[string]string{"_offset": "10"}},
			{"_offset past the end", "name=shape&_offset=100", nil, 0, nil, []string{"first", "previous", "self"}, map[string]string{"_offset": "100"}},
			{"_sort=_lastUpdated", "name=shape&_sort=_lastUpdated&_count=100", created, 25, nil, []string{"first", "self"}, map[string]string{"_sort": "_lastUpdated"}},
			{"_sort=-_lastUpdated", "name=shape&_sort=-_lastUpdated&_count=100", reversed(created), 25, nil, []string{"first", "self"}, map[string]string{"_sort": "-_lastUpdated"}},
			{"_sort=-_lastUpdated paged", "name=shape&_sort=-_lastUpdated&_count=3&_offset=3", reversed(created)[3:6], 3, nil, []string{"first", "next", "previous", "self"}, nil},
			{"no match", "name=nobody", nil, 0, nil, []string{"self"}, nil},
			{"_format ignored", "name=shape&_format=json&_count=1", created[:1], 1, nil, []string{"first", "next", "self"}, nil},
		} {
			r := c.Do("GET", "fhir/R4/Patient?"+tc.query, nil, "")
			if r.Status != 200 {
				t.Errorf("%s: %d %s", tc.what, r.Status, r.Body)
				continue
			}
			ids := entryIDs(t, r)
			if len(ids) != tc.n || (tc.want != nil && !slices.Equal(ids, tc.want)) {
				t.Errorf("%s: %d entries %v, want %d %v", tc.what, len(ids), ids, tc.n, tc.want)
			}
			if got := r.JSON()["total"]; got != tc.total {
				t.Errorf("%s: total %v, want %v", tc.what, got, tc.total)
			}
			if tc.n == 0 && r.JSON()["entry"] != nil {
				t.Errorf("%s: entry present but empty", tc.what)
			}
			l := links(t, r)
			if got := sorted(keysOf(l)); !slices.Equal(got, tc.links) {
				t.Errorf("%s: links %v, want %v", tc.what, got, tc.links)
			}
			if tc.self != nil {
				checkQuery(t, tc.what+" self", l["self"], tc.self)
			}
		}
	})
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func reversed(s []string) []string {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// checkQuery checks parameters of a link URL; "" means absent.
func checkQuery(t *testing.T, what, link string, want map[string]string) {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Errorf("%s: %q: %v", what, link, err)
		return
	}
	q := u.Query()
	for k, v := range want {
		if got := q.Get(k); got != v {
			t.Errorf("%s link %q: %s=%q, want %q", what, link, k, got, v)
		}
	}
}

// searchCase is one search and the fixtures (by label) it must find.
type searchCase struct {
	query string
	want  []string
}

// runSearchCases runs the cases against c and compares found ids as sets.
func runSearchCases(t *testing.T, c *servertest.Client, typ string, ids map[string]string, cases []searchCase) {
	t.Helper()
	for _, tc := range cases {
		r := c.Do("GET", "fhir/R4/"+typ+"?"+tc.query+"&_count=100", nil, "")
		if r.Status != 200 {
			t.Errorf("%s?%s: %d %s", typ, tc.query, r.Status, r.Body)
			continue
		}
		got := entryIDs(t, r)
		// The self link is the same search: following it finds the same.
		self := links(t, r)["self"]
		base := strings.TrimSuffix(c.Base(), "/")
		if !strings.HasPrefix(self, base+"/fhir/R4/"+typ+"?") {
			t.Errorf("%s?%s: self link %q", typ, tc.query, self)
		} else if again := c.Do("GET", strings.TrimPrefix(self, base), nil, ""); again.Status != 200 || !slices.Equal(entryIDs(t, again), got) {
			t.Errorf("%s?%s: self link %q answers %d with %v, want %v", typ, tc.query, self, again.Status, entryIDs(t, again), got)
		}
		var want []string
		for _, label := range tc.want {
			id, ok := ids[label]
			if !ok {
				t.Fatalf("no fixture %q", label)
			}
			want = append(want, id)
		}
		if !equalSets(got, want) {
			names := map[string]string{}
			for k, v := range ids {
				names[v] = k
			}
			var gotNames []string
			for _, id := range got {
				if n, ok := names[id]; ok {
					gotNames = append(gotNames, n)
				} else {
					gotNames = append(gotNames, id)
				}
			}
			t.Errorf("%s?%s: found %v, want %v", typ, tc.query, sorted(gotNames), sorted(tc.want))
		}
	}
}

// TestSearchHumanProfiles covers identifier, name and email with every
// token and string modifier, on every type that has them.
func TestSearchHumanProfiles(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "humans")
		anchor := str(c.Create(map[string]any{"resourceType": "Patient"}), "id")
		for _, typ := range []string{"Patient", "Practitioner", "RelatedPerson"} {
			t.Run(typ, func(t *testing.T) {
				mk := func(extra map[string]any) string {
					r := map[string]any{"resourceType": typ}
					if typ == "RelatedPerson" {
						r["patient"] = map[string]any{"reference": "Patient/" + anchor}
					}
					for k, v := range extra {
						r[k] = v
					}
					return str(c.Create(r), "id")
				}
				ids := map[string]string{
					"a": mk(map[string]any{
						"identifier": []any{map[string]any{"system": "urn:sys:a", "value": "123"}},
						"name":       []any{map[string]any{"family": "Zeta", "given": []any{"Alpha"}}},
						"telecom":    []any{map[string]any{"system": "email", "value": "zeta@example.com"}, map[string]any{"system": "phone", "value": "555"}},
						"active":     true,
					}),
					"b": mk(map[string]any{
						"identifier": []any{map[string]any{"system": "urn:sys:b", "value": "456"}, map[string]any{"value": "123"}},
						"name":       []any{map[string]any{"family": "Zetaline", "given": []any{"Beta"}}},
						"telecom":    []any{map[string]any{"system": "phone", "value": "zeta@example.com"}},
						"active":     false,
					}),
					"c": mk(map[string]any{"name": []any{map[string]any{"text": "O'Brien, Comma"}}}),
				}
				if typ == "Patient" {
					ids["anchor"] = anchor
				}
				rest := func(labels ...string) []string {
					if typ == "Patient" {
						return append(labels, "anchor")
					}
					return labels
				}
				runSearchCases(t, c, typ, ids, []searchCase{
					{"identifier=urn:sys:a|123", []string{"a"}},
					{"identifier=urn:sys:b|123", nil},
					{"identifier=123", []string{"a", "b"}},
					{"identifier=|123", []string{"b"}}, // no system
					{"identifier=urn:sys:b|", []string{"b"}},
					{"identifier=123,456", []string{"a", "b"}},
					{"identifier=urn%3Asys%3Aa%7C123", []string{"a"}},
					{"identifier:not=urn:sys:a|123", rest("b", "c")},
					{"identifier:not=123,456", rest("c")},
					{"identifier:missing=true", rest("c")},
					{"identifier:missing=false", []string{"a", "b"}},
					{"name=zeta", []string{"a", "b"}},
					{"name=ZET", []string{"a", "b"}},
					{"name=zetal", []string{"b"}},
					{"name=eta", nil}, // a prefix match, not contains
					{"name=alpha", []string{"a"}},
					{"name:exact=Zeta", []string{"a"}},
					{"name:exact=zeta", nil},
					{"name:exact=Zet", nil},
					{"name:contains=etal", []string{"b"}},
					{"name:contains=ETA", []string{"a", "b"}},
					{"name:contains=%25", nil},      // % is literal, not a LIKE wildcard
					{"name:contains=_", nil},        // so is _
					{"name=o'brien", []string{"c"}}, // text is searchable
					{"name=o%27brien%5C%2C%20comma", []string{"c"}},
					{"name=zeta,o'b", []string{"a", "b", "c"}},
					{"name:missing=true", rest()},
					{"email=zeta@example.com", []string{"a"}},
					{"email=ZETA@example.com", nil}, // tokens are exact
					{"email:missing=true", rest("b", "c")},
					{"email:not=zeta@example.com", rest("b", "c")},
					{"active=true", []string{"a"}},
					{"active=false", []string{"b"}},
					{"active:not=true", rest("b", "c")},
					{"_id=" + ids["a"], []string{"a"}},
					{"_id=" + ids["a"] + "," + ids["b"], []string{"a", "b"}},
					{"_id:not=" + ids["a"], rest("b", "c")},
					{"_id=not-a-uuid", nil},
					{"name=zeta&identifier=456", []string{"b"}}, // parameters are ANDed
				})
			})
		}
	})
}

// TestSearchOtherTypes covers identifier and name on Bot, ClientApplication
// and Project, email on User, _lastUpdated with every prefix, and AuditEvent.
func TestSearchOtherTypes(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "others")
		sa := s.SuperAdmin(t)
		for _, typ := range []string{"Bot", "ClientApplication"} {
			t.Run(typ, func(t *testing.T) {
				res := func(name, ident string) map[string]any {
					r := map[string]any{"resourceType": typ, "name": name + " " + typ}
					if typ == "Bot" { // ClientApplication has no identifier element
						r["identifier"] = []any{map[string]any{"system": "urn:t", "value": ident}}
					}
					return r
				}
				ids := map[string]string{
					"x": str(c.Create(res("Xray", "x1")), "id"),
					"y": str(c.Create(res("Yankee", "y1")), "id"),
				}
				cases := []searchCase{
					{"name=xray", []string{"x"}},
					{"name:exact=Yankee%20" + typ, []string{"y"}},
					{"name:contains=ankee", []string{"y"}},
				}
				if typ == "Bot" { // the reference defines no identifier parameter for ClientApplication
					cases = append(cases, []searchCase{
						{"identifier=urn:t|x1", []string{"x"}},
						{"identifier=urn:t|", []string{"x", "y"}},
						{"identifier:not=x1&name=xray,yankee", []string{"y"}},
					}...)
				}
				runSearchCases(t, c, typ, ids, cases)
			})
		}
		t.Run("Project", func(t *testing.T) {
			tag := fmt.Sprint(time.Now().UnixNano())
			ids := map[string]string{
				"p1": str(sa.Create(map[string]any{"resourceType": "Project", "name": "Proj One " + tag, "identifier": []any{map[string]any{"system": "urn:proj", "value": "one" + tag}}}), "id"),
				"p2": str(sa.Create(map[string]any{"resourceType": "Project", "name": "Proj Two " + tag}), "id"),
			}
			runSearchCases(t, sa, "Project", ids, []searchCase{
				{"name=proj%20one%20" + tag, []string{"p1"}},
				{"name:contains=" + tag, []string{"p1", "p2"}},
				{"identifier=urn:proj|one" + tag, []string{"p1"}},
				{"identifier=one" + tag, []string{"p1"}},
			})
			// A project admin sees its own project only.
			ids["own"] = c.ProjectID
			runSearchCases(t, c, "Project", ids, []searchCase{
				{"name=others", []string{"own"}},
				{"name:contains=" + tag, nil},
				{"_id=" + ids["p1"], nil},
			})
		})
		t.Run("User", func(t *testing.T) {
			tag := fmt.Sprint(time.Now().UnixNano())
			ids := map[string]string{
				"u1": str(sa.Create(map[string]any{"resourceType": "User", "firstName": "U", "lastName": "One", "email": "one" + tag + "@example.com"}), "id"),
				"u2": str(sa.Create(map[string]any{"resourceType": "User", "firstName": "U", "lastName": "Two", "email": "two" + tag + "@example.com"}), "id"),
			}
			runSearchCases(t, sa, "User", ids, []searchCase{
				{"email=one" + tag + "@example.com", []string{"u1"}},
				{"email=one" + tag + "@example.com,two" + tag + "@example.com", []string{"u1", "u2"}},
				{"email=one" + tag, []string{"u1"}}, // a string parameter, as the reference defines it
				{"email:exact=one" + tag + "@example.com", []string{"u1"}},
				{"email:exact=one" + tag, nil},
				{"_id=" + ids["u2"], []string{"u2"}},
			})
			if r := c.Do("GET", "fhir/R4/User?email=one"+tag+"@example.com", nil, ""); r.Status != 200 || len(entries(t, r)) != 0 {
				t.Errorf("project admin sees another project's User: %d %s", r.Status, r.Body)
			}
		})
		t.Run("_lastUpdated", func(t *testing.T) {
			a := c.Create(map[string]any{"resourceType": "Organization", "name": "LU first"})
			time.Sleep(20 * time.Millisecond)
			b := c.Create(map[string]any{"resourceType": "Organization", "name": "LU second"})
			ids := map[string]string{"a": str(a, "id"), "b": str(b, "id")}
			la, lb := str(a, "meta", "lastUpdated"), str(b, "meta", "lastUpdated")
			mid := mustTime(t, la).Add(10 * time.Millisecond).Format("2006-01-02T15:04:05.000Z")
			esc := url.QueryEscape
			runSearchCases(t, c, "Organization", ids, []searchCase{
				{"name=lu&_lastUpdated=gt" + esc(mid), []string{"b"}},
				{"name=lu&_lastUpdated=lt" + esc(mid), []string{"a"}},
				{"name=lu&_lastUpdated=ge" + esc(la), []string{"a", "b"}},
				{"name=lu&_lastUpdated=le" + esc(lb), []string{"a", "b"}},
				{"name=lu&_lastUpdated=gt" + esc(lb), nil},
				{"name=lu&_lastUpdated=eq" + la[:10], []string{"a", "b"}}, // the day
				{"name=lu&_lastUpdated=" + la[:4], []string{"a", "b"}},    // the year
				{"name=lu&_lastUpdated=ne" + la[:10], nil},
				{"name=lu&_lastUpdated=lt2000-01-01", nil},
				{"name=lu&_lastUpdated=gt2000-01-01&_lastUpdated=lt2999", []string{"a", "b"}},
			})
		})
		t.Run("AuditEvent", func(t *testing.T) {
			pat := str(c.Create(map[string]any{"resourceType": "Patient"}), "id")
			bot := str(c.Create(map[string]any{"resourceType": "Bot", "name": "audit bot"}), "id")
			ae := func(recorded, outcome, code, what string) string {
				return str(c.Create(map[string]any{"resourceType": "AuditEvent", "recorded": recorded, "outcome": outcome,
					"type":   map[string]any{"system": "http://terminology.hl7.org/CodeSystem/audit-event-type", "code": code},
					"agent":  []any{map[string]any{"requestor": true}},
					"source": map[string]any{"observer": map[string]any{"display": "x"}},
					"entity": []any{map[string]any{"what": map[string]any{"reference": what}}}}), "id")
			}
			ids := map[string]string{
				"2020": ae("2020-01-01T00:00:00.000Z", "0", "rest", "Patient/"+pat),
				"2021": ae("2021-06-15T12:00:00.000Z", "4", "rest", "Bot/"+bot),
				"2023": ae("2023-01-01T00:00:00Z", "8", "transmit", "Bot/"+bot),
			}
			runSearchCases(t, c, "AuditEvent", ids, []searchCase{
				{"entity=Patient/" + pat, []string{"2020"}},
				{"entity=Bot/" + bot, []string{"2021", "2023"}},
				{"entity=Bot%2F" + bot, []string{"2021", "2023"}},
				{"entity:not=Bot/" + bot, []string{"2020"}},
				{"entity=Patient/" + pat + ",Bot/" + bot, []string{"2020", "2021", "2023"}},
				{"type=rest", []string{"2020", "2021"}},
				{"type=http://terminology.hl7.org/CodeSystem/audit-event-type|transmit", []string{"2023"}},
				{"type:not=rest", []string{"2023"}},
				{"outcome=0", []string{"2020"}},
				{"outcome=4,8", []string{"2021", "2023"}},
				{"date=2021", []string{"2021"}},
				{"date=eq2021-06-15", []string{"2021"}},
				{"date=2021-06-15T12:00:00Z", []string{"2021"}},
				{"date=gt2021", []string{"2023"}},
				{"date=ge2021", []string{"2021", "2023"}},
				{"date=lt2021", []string{"2020"}},
				{"date=le2021", []string{"2020", "2021"}},
				{"date=ne2021", []string{"2020", "2023"}},
				{"date=gt2020-01-01T00:00:00Z&date=lt2023", []string{"2021"}},
				{"date=ge2020-01-01T00:00:00%2B00:00", []string{"2020", "2021", "2023"}},
				{"date=2022", nil},
				{"date:missing=false", []string{"2020", "2021", "2023"}},
			})
		})
	})
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse("2006-01-02T15:04:05.000Z", s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSearchMemberships covers every ProjectMembership parameter, as the
// project admin sees them, with the percent-encoded query @medplum/core sends.
func TestSearchMemberships(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "members")
		sa := s.SuperAdmin(t)
		prac := str(c.Create(map[string]any{"resourceType": "Practitioner"}), "id")
		pat := str(c.Create(map[string]any{"resourceType": "Patient"}), "id")
		bot := str(c.Create(map[string]any{"resourceType": "Bot", "name": "b"}), "id")
		ap := str(c.Create(map[string]any{"resourceType": "AccessPolicy", "name": "ap", "resource": []any{map[string]any{"resourceType": "Patient"}}}), "id")
		ap2 := str(c.Create(map[string]any{"resourceType": "AccessPolicy", "name": "ap2", "resource": []any{map[string]any{"resourceType": "Patient"}}}), "id")
		user := str(sa.Create(map[string]any{"resourceType": "User", "firstName": "P", "lastName": "R", "email": "pr-" + c.ProjectID + "@example.com"}), "id")
		m := func(fields map[string]any) string {
			r := map[string]any{"resourceType": "ProjectMembership", "meta": map[string]any{"project": c.ProjectID},
				"project": map[string]any{"reference": "Project/" + c.ProjectID}}
			for k, v := range fields {
				r[k] = v
			}
			return str(sa.Create(r), "id")
		}
		ref := func(s string) map[string]any { return map[string]any{"reference": s} }
		// The admin client's own membership, made by NewProject.
		own := entryIDs(t, c.Do("GET", "fhir/R4/ProjectMembership?profile="+c.Profile, nil, ""))
		if len(own) != 1 {
			t.Fatalf("own membership: %v", own)
		}
		ids := map[string]string{
			"own": own[0],
			"prac": m(map[string]any{"user": ref("User/" + user), "profile": ref("Practitioner/" + prac), "admin": true,
				"userName": "pracUser", "externalId": "ext-prac", "accessPolicy": ref("AccessPolicy/" + ap),
				"identifier": []any{map[string]any{"system": "urn:m", "value": "m1"}}}),
			"pat": m(map[string]any{"user": ref("User/" + user), "profile": ref("Patient/" + pat), "active": false,
				"access": []any{map[string]any{"policy": ref("AccessPolicy/" + ap2)}}}),
		}
		// The Bot's own membership, made with it; active set explicitly.
		botm := entryIDs(t, c.Do("GET", "fhir/R4/ProjectMembership?user=Bot/"+bot, nil, ""))
		if len(botm) != 1 {
			t.Fatalf("the Bot's membership: %v", botm)
		}
		ids["bot"] = botm[0]
		if r := sa.Do("PATCH", "fhir/R4/ProjectMembership/"+botm[0], `[{"op":"add","path":"/active","value":true}]`, "application/json-patch+json"); r.Status != 200 {
			t.Fatalf("activate the Bot's membership: %d %s", r.Status, r.Body)
		}
		if got := str(sa.Do("GET", "fhir/R4/ProjectMembership/"+ids["prac"], nil, "").JSON(), "meta", "project"); got != c.ProjectID {
			t.Fatalf("membership created in %q, want %q", got, c.ProjectID)
		}
		cases := []searchCase{
			{"project=Project/" + c.ProjectID, []string{"own", "prac", "pat", "bot"}},
			{"user=User/" + user, []string{"prac", "pat"}},
			{"user=Bot/" + bot, []string{"bot"}},
			{"profile=Practitioner/" + prac, []string{"prac"}},
			{"profile:not=Practitioner/" + prac, []string{"own", "pat", "bot"}},
			{"profile-type=Practitioner", []string{"prac"}},
			{"profile-type=Patient,Practitioner", []string{"prac", "pat"}},
			{"profile-type:not=ClientApplication,Bot", []string{"prac", "pat"}},
			{"profile-type%3Anot=ClientApplication%2CBot", []string{"prac", "pat"}},
			{"profile-type%3anot=ClientApplication%2cBot", []string{"prac", "pat"}},
			{"profile%2Dtype=Bot", []string{"bot"}},
			{"admin=true", []string{"own", "prac"}},
			{"admin=false", nil}, // admin is absent, not false, on the others
			{"admin:not=true", []string{"pat", "bot"}},
			{"admin:missing=true", []string{"pat", "bot"}},
			{"active=false", []string{"pat"}},
			{"active=true", []string{"bot"}},
			{"active:not=false", []string{"own", "prac", "bot"}},
			{"external-id=ext-prac", []string{"prac"}},
			{"external-id=EXT", []string{"prac"}},
			{"external-id:exact=ext-prac", []string{"prac"}},
			{"user-name=pracuser", []string{"prac"}},
			{"user-name:exact=pracuser", nil},
			{"user-name:missing=true", []string{"own", "pat", "bot"}},
			{"access-policy=AccessPolicy/" + ap, []string{"prac"}},
			{"access-policy=AccessPolicy/" + ap2, []string{"pat"}},
			{"access-policy:missing=true", []string{"own", "bot"}},
			{"identifier=urn:m|m1", []string{"prac"}},
			{"profile-type:not=ClientApplication,Bot&admin=true", []string{"prac"}},
		}
		runSearchCases(t, c, "ProjectMembership", ids, cases)
		// The super admin sees the same through an explicit project filter.
		runSearchCases(t, sa, "ProjectMembership", ids, []searchCase{
			{"project=Project/" + c.ProjectID + "&profile-type%3Anot=ClientApplication%2CBot", []string{"prac", "pat"}},
			{"_project=" + c.ProjectID + "&admin=true", []string{"own", "prac"}},
		})
	})
}

// TestSearchErrors checks the 400 answers of bad searches.
func TestSearchErrors(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "search-errors")
		for _, tc := range []struct{ path, text string }{
			{"Patient?x=1", "Unknown search parameter: x"},
			{"Patient?x%3Anot=1", "Unknown search parameter: x"},
			{"Patient?email:exact=a", ""},
			{"ProjectMembership?admin=yes", "Boolean search value must be 'true' or 'false'"},
			{"ProjectMembership?active=1", "Boolean search value must be 'true' or 'false'"},
			{"ProjectMembership?admin:not=TRUE", "Boolean search value must be 'true' or 'false'"},
			{"Patient?active=", "Boolean search value must be 'true' or 'false'"},
			{"Patient?name:missing=maybe", ""},
			{"Patient?_lastUpdated=yesterday", ""},
			{"AuditEvent?date=gt2021-13-45", ""},
			{"Patient?_count=-1", ""},
			{"Patient?_count=ten", ""},
			{"Patient?_offset=-5", ""},
			{"Patient?_offset=99999999", ""},
			{"Patient?_sort=nothing", ""},
			{"Patient?_sort=_project", "Unsupported sort parameter: _project"},
			{"Task?_filter=focus%20xx%20Task%2F1", "Unsupported _filter operator xx for reference parameter focus"},
			{"Task?_filter=focus%20eq", `Invalid _filter: expected "parameter operator value"`},
			{"Task?_filter=(focus%20eq%20Task%2F1", "Invalid _filter: missing )"},
			{"Patient?subject.name=x", "Unknown search parameter: subject"},
			{"Observation?subject.name=x", "Chained search on subject must name the target type (subject:Type.name)"},
			{"Observation?value-quantity=abc", "Invalid quantity value for value-quantity: abc"},
			{"Patient?_total=maybe", ""},
			{"Patient?name=%zz", ""},
			{"Patient?%zz=1", ""},
			{"Patient?name:bogus=x", ""},
			{"Patient?_id=" + strings.Repeat("a,", 200) + "a", "Too many values for search parameter _id (max 200)"},
			{"Patient?" + strings.Repeat("name=a&", 100) + "name=a", "Too many search parameters (max 100)"},
		} {
			r := c.Do("GET", "fhir/R4/"+tc.path, nil, "")
			wantOutcome(t, tc.path[:min(len(tc.path), 60)], r, 400, "invalid", tc.text)
		}
		// At the limits, SQLite still plans them (it refuses expressions
		// nested deeper than 1000).
		for _, q := range []string{"_id=" + strings.Repeat("a,", 199) + "a", "name=" + strings.Repeat("a,", 199) + "a",
			"name:contains=" + strings.Repeat("a,", 199) + "a", "_lastUpdated=" + strings.Repeat("ne2020,", 199) + "ne2020",
			strings.Repeat("identifier:not=a&", 98) + "name=" + strings.Repeat("a,", 199) + "a&_id:not=" + strings.Repeat("a,", 199) + "a"} {
			if r := c.Do("GET", "fhir/R4/Patient?"+q, nil, ""); r.Status != 200 {
				t.Errorf("search at the limits: %d %.300s", r.Status, r.Body)
			}
		}
	})
}

// TestSearchPost is POST /{type}/_search with a form body.
func TestSearchPost(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "search-post")
		id := str(c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Posted"}}}), "id")
		c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Other"}}})
		r := c.Do("POST", "fhir/R4/Patient/_search", "name=posted&_count=5", "application/x-www-form-urlencoded")
		if got := entryIDs(t, r); r.Status != 200 || !slices.Equal(got, []string{id}) {
			t.Errorf("POST _search: %d %v", r.Status, got)
		}
	})
}

// TestSearchWebAppQueries: the searches the reference's web app sends that
// the hand-written table lacked, as @medplum/core encodes them; the self
// link of each finds the same (runSearchCases follows it).
func TestSearchWebAppQueries(t *testing.T) {
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		c := s.NewProject(t, "webapp")
		pat := str(c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "App"}}}), "id")
		ref := map[string]any{"reference": "Patient/" + pat}
		ids := map[string]string{"patient": pat}
		for typ, extra := range map[string]map[string]any{
			"ServiceRequest":   {"status": "active", "intent": "order", "subject": ref},
			"DiagnosticReport": {"status": "final", "code": map[string]any{"text": "x"}, "subject": ref},
			"Media":            {"status": "completed", "content": map[string]any{"url": "x"}, "subject": ref},
			"DeviceRequest":    {"status": "active", "intent": "order", "codeCodeableConcept": map[string]any{"text": "x"}, "subject": ref},
			"Device":           {"patient": ref},
		} {
			extra["resourceType"] = typ
			ids[typ] = str(c.Create(extra), "id")
			runSearchCases(t, c, typ, ids, []searchCase{
				{"patient=Patient%2F" + pat, []string{typ}},
				{"patient=" + pat + "&_sort=-_lastUpdated", []string{typ}},
			})
			if typ != "Device" {
				runSearchCases(t, c, typ, ids, []searchCase{{"subject=Patient%2F" + pat, []string{typ}}})
			}
		}
		bot := str(c.Create(map[string]any{"resourceType": "Bot", "name": "timeline"}), "id")
		ids["task"] = str(c.Create(map[string]any{"resourceType": "Task", "status": "ready", "intent": "order", "focus": map[string]any{"reference": "Bot/" + bot}}), "id")
		c.Create(map[string]any{"resourceType": "Task", "status": "ready", "intent": "order"})
		f := url.QueryEscape(fmt.Sprintf("based-on eq Bot/%s or focus eq Bot/%s or subject eq Bot/%s", bot, bot, bot))
		runSearchCases(t, c, "Task", ids, []searchCase{{"_filter=" + f, []string{"task"}}})
		ids["sub"] = str(c.Create(map[string]any{"resourceType": "Subscription", "status": "active", "reason": "r", "criteria": "Patient",
			"channel": map[string]any{"type": "rest-hook", "endpoint": "https://example.com/hook"}}), "id")
		runSearchCases(t, c, "Subscription", ids, []searchCase{
			{"url=https%3A%2F%2Fexample.com%2Fhook", []string{"sub"}},
			{"url=https%3A%2F%2Fexample.com%2Fother", nil},
		})
		// The reference's bots sort observations by date.
		ids["o1"] = str(c.Create(map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}}, "effectiveDateTime": "2020-01-01", "subject": ref}), "id")
		ids["o2"] = str(c.Create(map[string]any{"resourceType": "Observation", "status": "final", "code": map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}}, "effectiveDateTime": "2022-01-01", "subject": ref}), "id")
		r := c.Do("GET", "fhir/R4/Observation?code=http%3A%2F%2Floinc.org%7C8867-4&_sort=-date&_count=1", nil, "")
		if got := entryIDs(t, r); len(got) != 1 || got[0] != ids["o2"] {
			t.Errorf("_sort=-date: %v, want %s", got, ids["o2"])
		}
	})
}
