package runtime

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// TestSandboxReachesNothing runs a bot that tries to open files and
// directories, find preopened descriptors (directories or sockets) and read
// the environment, while the host has all of these to offer; it must get
// none of them, and still have a real clock and a random source.
func TestSandboxReachesNothing(t *testing.T) {
	t.Setenv("SANDBOT_SECRET_FOR_TEST", "must-not-leak")
	if err := os.WriteFile("sandbot.db", []byte("host file"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove("sandbot.db") })
	r := testRuntime(t)
	m := compileFixture(t, r, "sandbox.wasm")
	var seen []string
	for i := 0; i < 2; i++ {
		res, err := r.Execute(context.Background(), m, Execution{Event: event("probe")})
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Files, Fds, Env int
			Time            int64
			Random          string
			RandomOK        int
		}
		if err := json.Unmarshal(res.Envelope.Result, &got); err != nil {
			t.Fatalf("result %s: %v", res.Envelope.Result, err)
		}
		if got.Files != 0 || got.Fds != 0 || got.Env != 0 {
			t.Errorf("the bot reached the host: %+v", got)
		}
		if d := time.Since(time.Unix(got.Time, 0)); d < -time.Minute || d > time.Minute {
			t.Errorf("clock is not real: %d", got.Time)
		}
		if got.RandomOK != 1 || got.Random == "00000000000000000000000000000000" {
			t.Errorf("no random source: %+v", got)
		}
		seen = append(seen, got.Random)
	}
	if seen[0] == seen[1] {
		t.Errorf("two executions drew the same random bytes %s", seen[0])
	}
}
