package sqlstore

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
)

func TestZZExplain(t *testing.T) {
	url := os.Getenv("EXPLAIN_DB")
	if url == "" {
		t.Skip()
	}
	ctx := context.Background()
	s, err := Open(ctx, url, Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var n int
	sqlx.GetContext(ctx, s.db, &n, `SELECT COUNT(*) FROM resources`)
	if n == 0 {
		profiles := []string{"Patient", "Practitioner", "RelatedPerson", "ClientApplication", "Bot"}
		for lo := 0; lo < 100000; lo += 1000 {
			var list []fhir.Resource
			for i := lo; i < lo+1000; i++ {
				typ := profiles[i%5]
				list = append(list, fhir.Resource{"resourceType": "ProjectMembership", "project": map[string]any{"reference": "Project/p1"},
					"user": map[string]any{"reference": "User/" + uuid.NewString()}, "profile": map[string]any{"reference": typ + "/" + uuid.NewString()}})
			}
			if err := s.CreateMany(ctx, list, store.Write{Project: "p1"}); err != nil {
				t.Fatal(err)
			}
		}
		if s.dialect == SQLite {
			s.db.Exec(`PRAGMA optimize=0x10002`)
		} else {
			s.db.Exec(`VACUUM ANALYZE`)
		}
	}
	sqlx.GetContext(ctx, s.db, &n, `SELECT COUNT(*) FROM resources WHERE resource_type = 'Patient'`)
	if n == 0 {
		for lo := 0; lo < 100000; lo += 1000 {
			var list []fhir.Resource
			for i := lo; i < lo+1000; i++ {
				list = append(list, fhir.Resource{"resourceType": "Patient", "active": true, "gender": []string{"female", "male"}[i%2],
					"birthDate": fmt.Sprintf("%04d-%02d-%02d", 1940+i%70, 1+i%12, 1+i%28),
					"name": []any{map[string]any{"family": fmt.Sprintf("Fam%05d", i%10000), "given": []any{fmt.Sprintf("Given%06d", i)}}}})
			}
			if err := s.CreateMany(ctx, list, store.Write{Project: "p1"}); err != nil {
				t.Fatal(err)
			}
		}
		if s.dialect == SQLite {
			s.db.Exec(`PRAGMA optimize=0x10002`)
		} else {
			s.db.Exec(`VACUUM ANALYZE`)
		}
	}
	typ := os.Getenv("EXPLAIN_T")
	if typ == "" {
		typ = "ProjectMembership"
	}
	for _, q := range strings.Split(os.Getenv("EXPLAIN_Q"), ";;") {
		req, err := fhir.ParseSearch(typ, q)
		if err != nil {
			t.Fatal(err)
		}
		b := &builder{projects: []any{"p1"}, typ: typ}
		var conds []cond
		for _, f := range req.Filters {
			conds = append(conds, b.filter(f, "r"))
		}
		sqlText, args, err := s.pageQuery(ctx, b, req, conds)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, 21, 0)
		sqlText = s.rebind(sqlText + ` LIMIT ? OFFSET ?`)
		fmt.Println("==", q, "\n", sqlText, args)
		prefix := "EXPLAIN QUERY PLAN "
		if s.dialect == Postgres {
			prefix = "EXPLAIN ANALYZE "
		}
		rows, err := s.db.QueryContext(ctx, prefix+sqlText, args...)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			rows.Scan(ptrs...)
			fmt.Println(vals...)
		}
		rows.Close()
	}
}
