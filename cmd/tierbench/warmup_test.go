package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWarmupIsNotMeasured: a store workload with a warm-up stores blocks
// before it measures (the data set grows by more than the row's keys);
// without one, by exactly the row's keys. With --keys, stores have none
// (exactly that many are stored), lookups and loads do.
func TestWarmupIsNotMeasured(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "16", "--block-size", "8KiB")
	store := func(more ...string) (rowKeys, grew int64) {
		before := readManifestT(t, dir).Blocks
		args := append([]string{"store", "--dir", dir, "--engine", "sync", "--batch", "1", "--depth", "1", "--json"}, more...)
		code, stdout, stderr := tierbench(t, args...)
		require.Equal(t, exitOK, code, stderr)
		lines := jsonLines(t, stdout)
		require.Len(t, lines, 1, stdout)
		var row struct{ Keys int64 }
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &row))
		require.Positive(t, row.Keys)
		return row.Keys, int64(readManifestT(t, dir).Blocks - before)
	}

	keys, grew := store("--duration", "100ms", "--warmup", "300ms")
	assert.Greater(t, grew, keys, "the warm-up's stores are in the data set, not in the row")
	keys, grew = store("--duration", "100ms", "--warmup", "0")
	assert.Equal(t, keys, grew)
	keys, grew = store("--keys", "24", "--warmup", "300ms")
	assert.Equal(t, int64(24), keys)
	assert.Equal(t, keys, grew, "--keys stores exactly that many, without a warm-up")

	out := mustRun(t, "lookup", "--dir", dir, "--engine", "sync", "--keys", "64", "--warmup", "20ms")
	assert.Contains(t, out, "64 keys per workload after 20ms of warm-up")
	runDir := t.TempDir()
	out = mustRun(t, "run", "--dir", runDir, "--blocks", "16", "--block-size", "8KiB", "--engine", "sync",
		"--workloads", "lookup,store", "--keys", "24", "--warmup", "20ms")
	assert.Contains(t, out, "24 keys per workload after 20ms of warm-up (stores: none)")
	out = mustRun(t, "store", "--dir", dir, "--engine", "sync", "--keys", "24", "--warmup", "20ms")
	assert.NotContains(t, out, "warm-up")

	out = mustRun(t, "lookup", "--dir", dir, "--engine", "sync", "--duration", "50ms", "--warmup", "20ms")
	assert.Contains(t, out, "50ms per workload after 20ms of warm-up")
	out = mustRun(t, "lookup", "--dir", dir, "--engine", "sync", "--duration", "50ms", "--warmup", "0")
	assert.NotContains(t, out, "warm-up")

	code, _, stderr := tierbench(t, "store", "--dir", dir, "--warmup", "-1s")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--warmup must not be negative")
}
