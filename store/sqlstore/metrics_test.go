package sqlstore_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbot/sandbot/fhir"
	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// TestStoreMetrics checks what the store reports: the time of reads,
// searches and transactions (not of a read inside a transaction, which the
// transaction's time covers), and as errors only the database's: a caller's
// not found is not one, a failed statement is.
func TestStoreMetrics(t *testing.T) {
	for _, be := range storetest.Backends(t) {
		t.Run(be.Name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s, err := sqlstore.Open(context.Background(), be.NewURL(t), sqlstore.Options{Migrate: true, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			rec, err := s.Create(ctx, fhir.Resource{"resourceType": "Patient"}, store.Write{Project: "p1"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Read(ctx, store.AllProjects, "Patient", rec.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Read(ctx, store.AllProjects, "Patient", "00000000-0000-0000-0000-000000000000"); err == nil {
				t.Fatal("read of a missing Patient succeeded")
			}
			if _, err := s.Search(ctx, store.AllProjects, &fhir.SearchRequest{ResourceType: "Patient", Count: 10}); err != nil {
				t.Fatal(err)
			}
			if err := s.InTx(ctx, func(tx store.Store) error {
				_, err := tx.Read(ctx, store.AllProjects, "Patient", rec.ID)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			failed := s.InTx(ctx, func(tx store.Store) error {
				_, err := s.DB().ExecContext(ctx, `SELECT * FROM no_such_table`)
				return err
			})
			if failed == nil {
				t.Fatal("a statement on a missing table succeeded")
			}

			count := func(op string) int {
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				for _, mf := range mfs {
					if mf.GetName() != "sandbot_store_operation_duration_seconds" {
						continue
					}
					for _, m := range mf.GetMetric() {
						for _, l := range m.GetLabel() {
							if l.GetName() == "op" && l.GetValue() == op {
								return int(m.GetHistogram().GetSampleCount())
							}
						}
					}
				}
				return 0
			}
			// Two reads (the read inside a transaction is the transaction's);
			// the create's, the read's and the failed transaction (besides
			// the migrations').
			if got := count("read"); got != 2 {
				t.Errorf("reads timed: %d, want 2", got)
			}
			if got := count("search"); got != 1 {
				t.Errorf("searches timed: %d, want 1", got)
			}
			if got := count("transaction"); got < 3 {
				t.Errorf("transactions timed: %d, want at least 3", got)
			}
			// Each transaction's start is timed too.
			if got, txs := count("begin"), count("transaction"); got < txs {
				t.Errorf("transaction starts timed: %d, want at least the %d transactions", got, txs)
			}
			errs := func(op, kind string) float64 {
				c, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				for _, mf := range c {
					if mf.GetName() != "sandbot_store_errors_total" {
						continue
					}
					for _, m := range mf.GetMetric() {
						labels := map[string]string{}
						for _, l := range m.GetLabel() {
							labels[l.GetName()] = l.GetValue()
						}
						if labels["op"] == op && labels["kind"] == kind {
							if labels["store"] != be.Name {
								t.Errorf("store label %q, want %q", labels["store"], be.Name)
							}
							return m.GetCounter().GetValue()
						}
					}
				}
				t.Fatalf("no sandbot_store_errors_total{op=%q,kind=%q}", op, kind)
				return 0
			}
			if got := errs("read", "database"); got != 0 {
				t.Errorf("a missing Patient counted as a database error (%v)", got)
			}
			if got := errs("transaction", "database"); got != 1 {
				t.Errorf("transaction database errors: %v, want 1", got)
			}
			if got := errs("transaction", "unavailable"); got != 0 {
				t.Errorf("transaction unavailable errors: %v, want 0", got)
			}
		})
	}
}
