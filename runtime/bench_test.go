package runtime

import (
	"context"
	"testing"
)

func benchExecute(b *testing.B, fixtureName string, input any, noPool bool) {
	r, err := New(context.Background(), Config{noPool: noPool})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(context.Background())
	m := compileFixture(b, r, fixtureName)
	ev := event(input)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := r.Execute(context.Background(), m, Execution{Event: ev}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExecuteCEcho(b *testing.B) {
	b.Run("pool", func(b *testing.B) { benchExecute(b, "echo.wasm", "hello", false) })
	b.Run("nopool", func(b *testing.B) { benchExecute(b, "echo.wasm", "hello", true) })
}

func BenchmarkExecuteGoHello(b *testing.B) {
	in := map[string]string{"name": "Ada"}
	b.Run("pool", func(b *testing.B) { benchExecute(b, "gohello.wasm", in, false) })
	b.Run("nopool", func(b *testing.B) { benchExecute(b, "gohello.wasm", in, true) })
}
