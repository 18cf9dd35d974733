package sqlstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/sandbot/sandbot/store"
	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// TestModuleArtifacts: an artifact is kept once per module and platform
// (the first stored wins) and read back byte for byte.
func TestModuleArtifacts(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st, err := sqlstore.Open(ctx, b.NewURL(t), sqlstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if a, err := st.ModuleArtifact(ctx, "h", "p"); a != nil || err != nil {
				t.Fatalf("before: %v %v", a, err)
			}
			code := make([]byte, 15<<20)
			rand.Read(code)
			start := time.Now()
			if err := st.PutModuleArtifact(ctx, &store.ModuleArtifact{ModuleHash: "h", Platform: "p", Name: "p/x", Code: code, Prepared: []byte("prep"), MAC: "m1"}); err != nil {
				t.Fatal(err)
			}
			t.Logf("stored 15 MiB in %v", time.Since(start))
			if err := st.PutModuleArtifact(ctx, &store.ModuleArtifact{ModuleHash: "h", Platform: "p", Name: "p/y", Code: []byte("other"), Prepared: []byte("prep2"), MAC: "m2"}); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			a, err := st.ModuleArtifact(ctx, "h", "p")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("read 15 MiB in %v", time.Since(start))
			if a.Name != "p/x" || a.MAC != "m1" || !bytes.Equal(a.Code, code) || string(a.Prepared) != "prep" {
				t.Errorf("read back %q %q %d bytes", a.Name, a.MAC, len(a.Code))
			}
			if a, err := st.ModuleArtifact(ctx, "h", "other"); a != nil || err != nil {
				t.Errorf("another platform: %v %v", a, err)
			}
		})
	}
}
