package sqlstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// The write hook sees a transaction's writes (with what they replaced)
// before it commits; what it writes commits with them, and its error rolls
// them back.
func TestWriteHook(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s, err := sqlstore.Open(ctx, b.NewURL(t), sqlstore.Options{Migrate: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var seen [][]store.Written
			fail := false
			s.SetWriteHook(func(ctx context.Context, tx store.Store, ws []store.Written) error {
				seen = append(seen, ws)
				if fail {
					return errors.New("refused")
				}
				if ws[0].Record.ResourceType == "Patient" {
					_, err := tx.Create(ctx, fhir.Resource{"resourceType": "Basic"}, store.Write{Project: "p1"})
					return err
				}
				return nil
			})
			w := store.Write{Project: "p1"}
			rec, err := s.Create(ctx, fhir.Resource{"resourceType": "Patient", "gender": "male"}, w)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Update(ctx, store.AllProjects, "Patient", rec.ID, w, func(r fhir.Resource) (fhir.Resource, error) {
				r["gender"] = "female"
				return r, nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, store.AllProjects, "Patient", rec.ID, w); err != nil {
				t.Fatal(err)
			}
			if len(seen) != 3 {
				t.Fatalf("the hook saw %d transactions", len(seen))
			}
			create, update, del := seen[0][0], seen[1][0], seen[2][0]
			if create.Interaction != "create" || create.Previous != nil || create.Record.ID != rec.ID {
				t.Errorf("create: %+v", create)
			}
			prev, _ := fhir.ParseResource(update.Previous)
			cur, _ := update.Record.Resource()
			if update.Interaction != "update" || prev.String("gender") != "male" || cur.String("gender") != "female" {
				t.Errorf("update: %+v", update)
			}
			prev, _ = fhir.ParseResource(del.Previous)
			if del.Interaction != "delete" || !del.Record.Deleted || prev.String("gender") != "female" {
				t.Errorf("delete: %+v", del)
			}
			found, _ := store.SearchResources(ctx, s, store.AllProjects, "Basic", "")
			if len(found) != 3 {
				t.Errorf("the hook's own writes: %d Basic", len(found))
			}
			fail = true
			if _, err := s.Create(ctx, fhir.Resource{"resourceType": "Observation", "status": "final"}, w); err == nil {
				t.Fatal("a write the hook refused was kept")
			}
			if found, _ := store.SearchResources(ctx, s, store.AllProjects, "Observation", ""); len(found) != 0 {
				t.Errorf("%d Observations after a refusal", len(found))
			}
		})
	}
}
