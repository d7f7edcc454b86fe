package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRounds(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "40")
	out := mustRun(t, append([]string{"lookup", "--dir", dir, "--engine", "all", "--rounds", "3", "--json"}, tinyWorkload...)...)
	var order []string
	keys := map[string][]float64{}
	var ratio *engineRatio
	for _, line := range jsonLines(t, out) {
		var head struct{ Type string }
		require.NoError(t, json.Unmarshal([]byte(line), &head), line)
		switch head.Type {
		case "result":
			var r result
			require.NoError(t, json.Unmarshal([]byte(line), &r))
			assert.Equal(t, "lookup", r.Workload)
			assert.Equal(t, int64(96), r.Keys)
			order = append(order, r.Engine+"@"+string(rune('0'+r.Round)))
			keys[r.Engine] = append(keys[r.Engine], r.KeysPerSec)
		case "engine_ratio":
			require.Nil(t, ratio, "one ratio for one workload and two engines")
			ratio = new(engineRatio)
			require.NoError(t, json.Unmarshal([]byte(line), ratio))
		default:
			t.Fatalf("unexpected line %s", line)
		}
	}
	if len(keys) == 1 { // io_uring unusable at this moment: sync alone, nothing to compare
		assert.Equal(t, []string{"sync@1", "sync@2", "sync@3"}, order)
		assert.Nil(t, ratio)
		return
	}
	// Each round runs both engines, the one that went second going first next.
	assert.Equal(t, []string{"uring@1", "sync@1", "sync@2", "uring@2", "uring@3", "sync@3"}, order)
	require.NotNil(t, ratio)
	assert.Equal(t, "lookup", ratio.Workload)
	assert.Equal(t, "uring", ratio.Engine)
	assert.Equal(t, "sync", ratio.Against)
	assert.Equal(t, 3, ratio.Rounds)
	require.Len(t, ratio.KeysPerSec.Rounds, 3)
	// Round 2 lists sync first; its ratio is still uring's over sync's.
	for i, v := range ratio.KeysPerSec.Rounds {
		assert.InDelta(t, keys["uring"][i]/keys["sync"][i], v, 1e-9, "round %d", i+1)
	}
	assert.Len(t, ratio.CPUPerKey.Rounds, 3)
	assert.Len(t, ratio.CallerP999.Rounds, 3)

	text := mustRun(t, append([]string{"lookup", "--dir", dir, "--engine", "all", "--rounds", "2"}, tinyWorkload...)...)
	assert.Regexp(t, `(?m)^\s*uring\s+lookup\s+2\s+8\s+96\s`, text, "the table has a round column")
	assert.Regexp(t, `(?m)^uring ÷ sync, lookup, median of 2 rounds \(range\): keys/s [0-9.]+ \([0-9.]+–[0-9.]+\), cpu/key [0-9.]+ \([0-9.]+–[0-9.]+\), caller p99.9 `, text)
}

func TestEngineRatios(t *testing.T) {
	row := func(round int, engine, workload string, keys, cpu, caller float64) *result {
		return &result{Round: round, Engine: engine, Workload: workload, Jobs: 1, KeysPerSec: keys, CPUUSPerKey: cpu, CallerUS: latencyUS{P999: caller}}
	}
	rs := []*result{
		row(1, "uring", "lookup", 300, 2, 100), row(1, "sync", "lookup", 100, 4, 100),
		row(1, "uring", "load", 10, 1, 1), row(1, "sync", "load", 10, 1, 1),
		row(2, "sync", "lookup", 100, 4, 50), row(2, "uring", "lookup", 100, 4, 100),
		row(3, "uring", "lookup", 200, 1, 100),                                      // its sync row is missing: round 3 is left out
		row(4, "uring", "lookup", 150, 2, 100), row(4, "sync", "lookup", 0, 4, 100), // no keys: left out
		row(5, "uring", "lookup", 200, 2, 300), row(5, "sync", "lookup", 100, 2, 100),
		row(5, "uring", "populate", 1, 1, 1),
	}
	got := engineRatios(rs)
	require.Len(t, got, 2)
	lk := got[0]
	assert.Equal(t, "lookup", lk.Workload)
	assert.Equal(t, 3, lk.Rounds)
	assert.Equal(t, []float64{3, 1, 2}, lk.KeysPerSec.Rounds)
	assert.Equal(t, spread{Median: 2, Min: 1, Max: 3, Rounds: []float64{3, 1, 2}}, lk.KeysPerSec)
	assert.Equal(t, []float64{0.5, 1, 1}, lk.CPUPerKey.Rounds)
	assert.Equal(t, 1.0, lk.CPUPerKey.Median)
	assert.Equal(t, []float64{1, 2, 3}, lk.CallerP999.Rounds)
	assert.Equal(t, "uring ÷ sync, lookup, median of 3 rounds (range): keys/s 2.00 (1.00–3.00), cpu/key 1.00 (0.50–1.00), caller p99.9 2.00 (1.00–3.00)", lk.text)
	assert.Equal(t, "uring ÷ sync, load: keys/s 1.00, cpu/key 1.00, caller p99.9 1.00", got[1].text)

	// An even number of rounds: the median is between the middle two.
	assert.Equal(t, 2.5, newSpread([]float64{4, 1, 3, 2}).Median)
	// One engine, or rows of jobs and of mixed's phases: nothing to compare.
	assert.Empty(t, engineRatios([]*result{row(1, "sync", "lookup", 1, 1, 1)}))
	mixed := []*result{row(1, "uring", "lookup", 2, 1, 1), row(1, "sync", "lookup", 1, 1, 1)}
	mixed[0].Phase, mixed[1].Phase = "mixed", "mixed"
	assert.Empty(t, engineRatios(mixed))
	assert.Empty(t, strings.TrimSpace(ratioLines(nil)))
}
