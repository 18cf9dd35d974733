package fhirservice

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update", false, "rewrite the README's table of who may write what from Rules")

// docRoles are the columns of the README's table.
var docRoles = []struct {
	name  string
	roles Role
}{
	{"super admin", SuperAdmin},
	{"project admin", ProjectAdmin},
	{"member", Member},
	{"bot", Member | Bot},
	{"bot with an admin membership", ProjectAdmin | Bot},
	{"the server", System},
}

// interactions names what a cell allows of the REST interactions (the
// operations have a table of their own).
func interactions(deny Op) string {
	deny &= OpAll
	if deny&OpAll == OpAll {
		return "none"
	}
	if deny == 0 {
		return "all"
	}
	var out []string
	for _, x := range []struct {
		op   Op
		name string
	}{{OpRead, "read"}, {OpCreate, "create"}, {OpUpdate, "update"}, {OpDelete, "delete"}} {
		if deny&x.op == 0 {
			out = append(out, x.name)
		}
	}
	return strings.Join(out, ", ")
}

// operationCell says whether the rows and needs allow an operation to roles
// (before an access policy, which may take it away).
func operationCell(o Operation, roles Role) string {
	if compileRules(o.Type, roles).deny&o.Op != 0 {
		return "no"
	}
	for _, n := range o.Needs {
		if compileRules(n.Type, roles).deny&n.Op != 0 {
			return "no"
		}
	}
	return "yes"
}

// roleNames says which principals a rule binds.
func roleNames(r Role) string {
	switch r {
	case Everyone:
		return "everyone"
	case Callers:
		return "every caller"
	case NotSuperAdmin:
		return "all but super admins"
	}
	var out []string
	for _, x := range []struct {
		role Role
		name string
	}{{SuperAdmin, "super admins"}, {ProjectAdmin, "project admins"}, {Member, "members"}, {Bot, "bots"}} {
		if r&x.role != 0 {
			out = append(out, x.name)
		}
	}
	return strings.Join(out, ", ")
}

// rulesMarkdown renders Rules as the README shows them.
func rulesMarkdown() string {
	var b strings.Builder
	b.WriteString("| resource type |")
	for _, r := range docRoles {
		b.WriteString(" " + r.name + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(docRoles)) + "\n")
	var types []string
	for _, r := range Rules {
		if r.Field == "" && r.Deny&OpAll != 0 && !slices.Contains(types, r.Type) {
			types = append(types, r.Type)
		}
	}
	for _, typ := range types {
		b.WriteString("| " + typ + " |")
		for _, r := range docRoles {
			b.WriteString(" " + interactions(compileRules(typ, r.roles).deny) + " |")
		}
		b.WriteString("\n")
	}
	b.WriteString("| any other type |" + strings.Repeat(" all |", len(docRoles)) + "\n\n")
	b.WriteString("| operation | needs |")
	for _, r := range docRoles {
		b.WriteString(" " + r.name + " |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(docRoles)) + "\n")
	for _, o := range Operations {
		var needs []string
		for _, n := range o.Needs {
			needs = append(needs, n.Type+" "+interactions(OpAll&^n.Op))
		}
		b.WriteString("| " + o.Type + " `" + o.Name + "` | " + strings.Join(needs, ", ") + " |")
		for _, r := range docRoles {
			b.WriteString(" " + operationCell(o, r.roles) + " |")
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	b.WriteString("| field | hidden from | read-only for | fixed at creation for | server-managed for |\n|---|---|---|---|---|\n")
	for _, r := range Rules {
		if r.Field == "" {
			continue
		}
		cells := map[Access]string{r.Access: roleNames(r.Roles)}
		typ := r.Type
		if typ == "*" {
			typ = "every type"
		}
		b.WriteString("| " + typ + " `" + r.Field + "` | " + cells[Hidden] + " | " + cells[ReadOnly] + " | " + cells[Fixed] + " | " + cells[Managed] + " |\n")
	}
	return b.String()
}

const (
	docBegin = "<!-- rules:begin (generated from internal/services/fhirservice Rules: go test ./internal/services/fhirservice -run TestDocumentedRules -update) -->\n"
	docEnd   = "<!-- rules:end -->"
)

// TestDocumentedRules: the README's table of who may write what is the
// table the service enforces.
func TestDocumentedRules(t *testing.T) {
	const path = "../../../README.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i, j := strings.Index(readme, docBegin), strings.Index(readme, docEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the markers %q and %q", docBegin, docEnd)
	}
	want := rulesMarkdown()
	if got := readme[i+len(docBegin) : j]; got != want {
		if *updateDocs {
			if err := os.WriteFile(path, []byte(readme[:i+len(docBegin)]+want+readme[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("README.md's rules table differs from Rules; run go test ./internal/services/fhirservice -run TestDocumentedRules -update\ngot:\n%s\nwant:\n%s", got, want)
	}
}
