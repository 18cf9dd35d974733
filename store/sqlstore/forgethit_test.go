package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbot/sandbot/store/sqlstore"
	"github.com/sandbot/sandbot/store/storetest"
)

// TestForgetHit: a forgotten key's next hit is its first; other keys keep
// their counts, and forgetting a window that is no longer the key's (it was
// forgotten and began again) leaves the new one.
func TestForgetHit(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st, err := sqlstore.Open(ctx, b.NewURL(t), sqlstore.Options{Migrate: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var ends time.Time
			for range 2 {
				_, ends, _ = st.CountHit(ctx, "a", time.Hour)
				st.CountHit(ctx, "b", time.Hour)
			}
			if err := st.ForgetHit(ctx, "a", ends); err != nil {
				t.Fatal(err)
			}
			if err := st.ForgetHit(ctx, "never counted", ends); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond) // windows are told apart by their end, in milliseconds
			if n, _, err := st.CountHit(ctx, "a", time.Hour); err != nil || n != 1 {
				t.Errorf("a after ForgetHit: %d %v", n, err)
			}
			if n, _, err := st.CountHit(ctx, "b", time.Hour); err != nil || n != 3 {
				t.Errorf("b: %d %v", n, err)
			}
			// The first window forgotten again: the second stays.
			if err := st.ForgetHit(ctx, "a", ends); err != nil {
				t.Fatal(err)
			}
			if n, _, err := st.CountHit(ctx, "a", time.Hour); err != nil || n != 2 {
				t.Errorf("a's next window after forgetting the one before: %d %v", n, err)
			}
		})
	}
}
