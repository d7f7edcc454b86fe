package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

func TestParseOptions(t *testing.T) {
	got, err := parseOptions("block_size=65536 namespace=llama-7b,engine=sync depth=8 batch_max=100 " +
		"lookup_timeout=250ms io_timeout=2s cache_ttl=1.5s cache_size=10 durability=full rings=2 ops_max=64 " +
		"workers_max=4 sync_workers=3 breaker_threshold=7 lookup_op=openpath direct=false")
	require.NoError(t, err)
	require.Equal(t, tier.Options{
		BlockSize: 65536, Namespace: "llama-7b", Engine: tier.EngineSync, Depth: 8, BatchMax: 100,
		LookupTimeout: 250 * time.Millisecond, IOTimeout: 2 * time.Second, LookupCacheTTL: 1500 * time.Millisecond,
		LookupCacheSize: 10, Durability: blockstore.DurabilityFull, Rings: 2, OpsMax: 64, WorkersMax: 4,
		SyncWorkers: 3, BreakerThreshold: 7, Lookup: tier.LookupOpenPath, NoDirect: true,
	}, got)
	got, err = parseOptions("block_size=4096 cache_ttl=0")
	require.NoError(t, err)
	require.Negative(t, got.LookupCacheTTL, "cache_ttl=0 turns the cache off")

	for _, tc := range []struct{ options, message string }{
		{"", "block_size is required"},
		{"namespace=x", "block_size is required"},
		{"block_size=4096 block_size=8192", `"block_size" given twice`},
		{"block_size=4096 colour=blue", `unknown option "colour"`},
		{"block_size=4096 depth", `"depth" is not key=value`},
		{"block_size=4k", `block_size="4k": not an integer`},
		{"block_size=4096 lookup_timeout=5", "not a duration with a unit"},
		{"block_size=4096 engine=fast", "want auto, uring or sync"},
		{"block_size=4096 durability=some", "want none, data or full"},
		{"block_size=4096 lookup_op=stat", "want openpath, statx or mixed"},
		{"block_size=4096 direct=maybe", "direct"},
	} {
		t.Run(tc.options, func(t *testing.T) {
			_, err := parseOptions(tc.options)
			require.ErrorIs(t, err, tier.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.message)
			require.Equal(t, utEOptions, int(code(err)))
		})
	}
}

func TestExists(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "present")
	require.NoError(t, os.WriteFile(present, nil, 0o644))
	paths := []byte(present + "\x00" + filepath.Join(dir, "absent") + "\x00" + present + "/below\x00")
	status := make([]byte, 3)
	found, err := exists(paths, 3, 5*time.Second, status)
	require.NoError(t, err)
	require.Equal(t, 1, found)
	require.Equal(t, []byte{byte(tier.StatusFound), byte(tier.StatusMissing), byte(tier.StatusMissing)}, status)

	// No time at all: nothing is answered, and every path says so.
	found, err = exists(paths, 3, 0, status)
	require.NoError(t, err)
	require.Equal(t, 0, found)
	require.Equal(t, []byte{byte(tier.StatusTimedOut), byte(tier.StatusTimedOut), byte(tier.StatusTimedOut)}, status)

	for _, tc := range []struct {
		paths string
		n     int
	}{{"a\x00b\x00", 3}, {"a\x00b", 2}, {"", 1}} {
		_, err := exists([]byte(tc.paths), tc.n, time.Second, make([]byte, tc.n))
		require.ErrorIs(t, err, errArg, "%q n=%d", tc.paths, tc.n)
	}
}
