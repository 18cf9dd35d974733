package sqlstore_test

import (
	"context"
	"testing"

	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

func TestConformance(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) store.Store {
				s, err := sqlstore.Open(context.Background(), b.NewURL(t), sqlstore.Options{Migrate: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
}

func TestMigrateTwiceIsNoop(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			url := b.NewURL(t)
			for i := 0; i < 2; i++ {
				s, err := sqlstore.Open(context.Background(), url, sqlstore.Options{Migrate: true})
				if err != nil {
					t.Fatalf("open %d: %v", i, err)
				}
				s.Close()
			}
		})
	}
}
