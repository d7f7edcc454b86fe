package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/uringtier/uringtier/uring"
)

// TestInterleave runs lookups and stores with --interleave 3: each
// engine's keys in three slices, the engines taking turns, the other one
// first at every slice, and a row per engine and workload that adds the
// slices up, their times too.
func TestInterleave(t *testing.T) {
	if err := uring.Available(); err != nil {
		t.Skipf("--interleave takes two engines; io_uring is not available: %v", err)
	}
	type slice struct {
		engine, workload string
		keys             int64
	}
	var ran []slice
	seconds := map[string]float64{} // workload and engine: the slices' seconds
	sliceRan = func(engine string, r *result) {
		ran = append(ran, slice{engine, r.Workload, r.Keys})
		seconds[r.Workload+" "+engine] += r.Seconds
	}
	t.Cleanup(func() { sliceRan = nil })
	t.Setenv("TMPDIR", t.TempDir())

	out := mustRun(t, append([]string{"--workloads", "lookup,store", "--interleave", "3", "--json"}, tiny...)...)
	var want []slice
	for _, w := range []string{"lookup", "store"} {
		for _, order := range [][]string{{"uring", "sync"}, {"sync", "uring"}, {"uring", "sync"}} {
			for _, e := range order {
				want = append(want, slice{e, w, 32}) // --keys 96 in three slices
			}
		}
	}
	assert.Equal(t, want, ran)

	var rows []string
	for _, line := range strings.Split(out, "\n") {
		var r struct {
			Type, Engine, Workload string
			Keys, Errors           int64
			Seconds                float64
		}
		if !strings.HasPrefix(line, "{") {
			continue
		}
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		if r.Type != "result" {
			continue
		}
		rows = append(rows, r.Workload+" "+r.Engine)
		assert.Equal(t, int64(96), r.Keys, line)
		assert.Zero(t, r.Errors, line)
		assert.Positive(t, r.Seconds, line)
		// Within a nanosecond a slice: each slice's seconds pass through a Duration.
		assert.InDelta(t, seconds[r.Workload+" "+r.Engine], r.Seconds, 3e-9, "the row's seconds are its slices': %s", line)
	}
	assert.Equal(t, []string{"lookup uring", "lookup sync", "store uring", "store sync"}, rows)
}
