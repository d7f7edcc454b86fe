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
	}, got.Options)
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

func TestParseLayoutOptions(t *testing.T) {
	got, err := parseOptions("block_size=4096 layout=vllm model=org/m-7B rank=3 group=1 vllm_base=org_m-7B_0123456789ab on_corrupt=remove format=raw")
	require.NoError(t, err)
	require.Equal(t, "vllm", got.layout)
	require.Equal(t, blockstore.VLLMSpec{Model: "org/m-7B", Base: "org_m-7B_0123456789ab", Rank: 3, Group: 1}, got.vllm)
	require.Equal(t, blockstore.CorruptRemove, got.OnCorrupt)
	opts, err := got.tierOptions(t.TempDir())
	require.NoError(t, err)
	require.NotNil(t, opts.VLLM)
	require.Equal(t, "org_m-7B_0123456789ab_r3", opts.VLLM.Namespace())
	require.Equal(t, 1, opts.VLLM.Group)

	got, err = parseOptions("block_size=4096 format=raw on_corrupt=quarantine")
	require.NoError(t, err)
	require.Equal(t, blockstore.FormatRaw, got.Format)
	require.Equal(t, blockstore.CorruptQuarantine, got.OnCorrupt)
	opts, err = got.tierOptions(t.TempDir())
	require.NoError(t, err)
	require.Nil(t, opts.VLLM)

	for _, tc := range []struct{ options, message string }{
		{"block_size=4096 format=zip", "want framed or raw"},
		{"block_size=4096 on_corrupt=burn", "want default, leave, remove or quarantine"},
		{"block_size=4096 layout=flat", "want fanout or vllm"},
		{"block_size=4096 model=org/m", "model is for layout=vllm"},
		{"block_size=4096 rank=1", "rank is for layout=vllm"},
		{"block_size=4096 layout=vllm model=m namespace=x", "namespace with layout=vllm"},
		{"block_size=4096 layout=vllm model=m format=framed", "vLLM's blocks are raw"},
		{"block_size=4096 layout=vllm rank=x", `rank="x": not an integer`},
	} {
		t.Run(tc.options, func(t *testing.T) {
			_, err := parseOptions(tc.options)
			require.ErrorIs(t, err, tier.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.message)
		})
	}
	// Resolving under the directory: no base directory for the model is an
	// IO error, two of them bad options.
	dir := t.TempDir()
	o, err := parseOptions("block_size=4096 layout=vllm model=org/m")
	require.NoError(t, err)
	_, err = o.tierOptions(dir)
	require.Equal(t, utEIO, int(code(err)), "%v", err)
	for _, d := range []string{"org_m_0123456789ab_r0", "org_m_ba9876543210"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	_, err = o.tierOptions(dir)
	require.Equal(t, utEOptions, int(code(err)), "%v", err)
	require.ErrorContains(t, err, "2 vLLM base directories")
}
