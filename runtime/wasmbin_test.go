package runtime

import (
	"bytes"
	"context"
	"github.com/sandbot/sandbot/internal/wasmtest"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

func dataSection(segs ...dataSegment) []byte {
	var items [][]byte
	for _, s := range segs {
		items = append(items, wasmtest.Cat([]byte{0, 0x41}, appendS32(nil, int32(uint32(s.offset))), []byte{0x0b}, wasmtest.ULEB(uint32(len(s.data))), s.data))
	}
	return wasmtest.Vec(items...)
}

func TestMergeData(t *testing.T) {
	// Out of order, disjoint: merged where the gap is short.
	body := dataSection(
		dataSegment{offset: 100, data: []byte("ab")},
		dataSegment{offset: 10, data: []byte("xy")},
		dataSegment{offset: 14, data: []byte("z")},
		dataSegment{offset: 10000, data: []byte("far")},
	)
	out, ok := mergeData(body)
	if !ok {
		t.Fatal("not merged")
	}
	want := dataSection(
		dataSegment{offset: 10, data: append(append([]byte("xy\x00\x00z"), make([]byte, 100-15)...), "ab"...)},
		dataSegment{offset: 10000, data: []byte("far")},
	)
	if !bytes.Equal(out, want) {
		t.Fatalf("got % x\nwant % x", out, want)
	}
	// Overlapping segments are left alone (the later one wins).
	if _, ok := mergeData(dataSection(dataSegment{offset: 10, data: []byte("abc")}, dataSegment{offset: 11, data: []byte("Z")})); ok {
		t.Fatal("overlapping segments merged")
	}
	// Negative (i.e. high) offsets round-trip.
	r := &reader{b: appendS32(nil, -5)}
	if v, err := r.s32(); err != nil || v != -5 {
		t.Fatalf("s32 %d %v", v, err)
	}
}

// TestMergeDataSameMemory instantiates the Go fixture with and without the
// rewrite and compares the initial memories byte for byte.
func TestMergeDataSameMemory(t *testing.T) {
	ctx := context.Background()
	orig := fixture(t, "gohello.wasm")
	_, prepared, _, err := prepareModule(orig, testBudget(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(orig, prepared) {
		t.Fatal("nothing rewritten")
	}
	mem := func(wasm []byte) []byte {
		r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
		defer r.Close(ctx)
		if err := instantiateHost(ctx, r); err != nil {
			t.Fatal(err)
		}
		// Stub WASI: only instantiation (data and element segments) runs.
		b := r.NewHostModuleBuilder("wasi_snapshot_preview1")
		cm, err := r.CompileModule(ctx, wasm)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range cm.ImportedFunctions() {
			if mod, name, _ := f.Import(); mod == "wasi_snapshot_preview1" {
				b.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(context.Context, []uint64) {}), f.ParamTypes(), f.ResultTypes()).Export(name)
			}
		}
		if _, err := b.Instantiate(ctx); err != nil {
			t.Fatal(err)
		}
		m, err := r.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithStartFunctions())
		if err != nil {
			t.Fatal(err)
		}
		data, _ := m.Memory().Read(0, m.Memory().Size())
		return bytes.Clone(data)
	}
	if !bytes.Equal(mem(orig), mem(prepared)) {
		t.Fatal("initial memory differs after merging data segments")
	}
}
