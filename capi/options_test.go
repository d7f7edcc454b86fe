package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
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

	got, err = parseOptions("block_size=4096 capacity=1073741824 high_watermark=0.75 low_watermark=0.5 " +
		"evict_min_age=1m30s evict_interval=250ms touch_interval=5s")
	require.NoError(t, err)
	require.Equal(t, int64(1<<30), got.Capacity)
	require.Equal(t, 0.75, got.HighWatermark)
	require.Equal(t, 0.5, got.LowWatermark)
	require.Equal(t, 90*time.Second, got.EvictMinAge)
	require.Equal(t, 250*time.Millisecond, got.EvictInterval)
	require.Equal(t, 5*time.Second, got.TouchInterval)
	got, err = parseOptions("block_size=4096 capacity_share=0.25 evict_min_age=0 touch_interval=0s")
	require.NoError(t, err)
	require.Equal(t, 0.25, got.CapacityShare)
	require.Negative(t, got.EvictMinAge, "evict_min_age=0: no minimum age")
	require.Negative(t, got.TouchInterval, "touch_interval=0 turns touches off")

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
		{"block_size=4096 capacity=1GiB", `capacity="1GiB": not an integer`},
		{"block_size=4096 capacity=1.5", `capacity="1.5": not an integer`},
		{"block_size=4096 capacity_share=half", `capacity_share="half": not a finite number`},
		{"block_size=4096 capacity_share=NaN", `capacity_share="NaN": not a finite number`},
		{"block_size=4096 high_watermark=inf", `high_watermark="inf": not a finite number`},
		{"block_size=4096 low_watermark=", `low_watermark="": not a finite number`},
		{"block_size=4096 evict_min_age=10", "not a duration with a unit"},
		{"block_size=4096 evict_min_age=-1s", "negative"},
		{"block_size=4096 evict_interval=1", "not a duration with a unit"},
		{"block_size=4096 touch_interval=soon", "not a duration with a unit"},
		{"block_size=4096 touch_interval=-5s", "negative"},
		{"block_size=4096 capacity=1 capacity=2", `"capacity" given twice`},
	} {
		t.Run(tc.options, func(t *testing.T) {
			_, err := parseOptions(tc.options)
			require.ErrorIs(t, err, tier.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.message)
			require.Equal(t, utEOptions, int(code(err)))
		})
	}
}

// TestOpenCapacityOptions: values that parse but that the tier rejects are
// UT_EOPTIONS too.
func TestOpenCapacityOptions(t *testing.T) {
	for _, tc := range []struct{ options, message string }{
		{"block_size=4096 capacity=-1", "Capacity -1"},
		{"block_size=4096 capacity_share=1.5", "CapacityShare 1.5"},
		{"block_size=4096 capacity_share=-0.1", "CapacityShare -0.1"},
		{"block_size=4096 capacity=1048576 capacity_share=0.5", "want one of"},
		{"block_size=4096 capacity=1048576 high_watermark=0.5 low_watermark=0.7", "watermarks low 0.7, high 0.5"},
		{"block_size=4096 capacity=1048576 high_watermark=1.5", "watermarks"},
		{"block_size=4096 capacity=1048576 low_watermark=-0.5", "watermarks"},
		{"block_size=4096 evict_interval=-1s", "negative duration"},
	} {
		t.Run(tc.options, func(t *testing.T) {
			_, err := open(t.TempDir(), tc.options, nil, 0)
			require.ErrorIs(t, err, tier.ErrInvalidOptions)
			require.ErrorContains(t, err, tc.message)
			require.Equal(t, utEOptions, int(code(err)))
		})
	}
}

// TestOKStatus holds the header's UT_OK_STATUS to tier.Status.OK for every
// status.
func TestOKStatus(t *testing.T) {
	for s := tier.StatusPending; s <= tier.StatusFull+1; s++ {
		require.Equal(t, s.OK(), okStatus(int(s)), "status %d (%v)", s, s)
	}
}

// TestStatsJSON: the delete op and the capacity counters are in ut_stats's
// JSON, by their names.
func TestStatsJSON(t *testing.T) {
	var s tier.Stats
	s.Requests[tier.OpDelete], s.Keys[tier.OpDelete] = 2, 5
	s.Outcomes[tier.OpDelete][tier.StatusDeleted] = 4
	s.Outcomes[tier.OpDelete][tier.StatusMissing] = 1
	s.Outcomes[tier.OpStore][tier.StatusFull] = 3
	s.CapacityLimit, s.Usage, s.Evictor, s.EvictorHolder = 1<<20, 12345, true, "host pid 7"
	s.Evicted, s.EvictedBytes, s.Scans, s.ScanBlocks = 6, 7, 8, 9
	s.DirsRescanned, s.Touches, s.TouchesDropped = 10, 11, 12
	var got map[string]any
	require.NoError(t, json.Unmarshal(statsJSON("ns", s), &got))
	ops := got["ops"].(map[string]any)
	require.Equal(t, map[string]any{"deleted": 4.0, "missing": 1.0}, ops["delete"].(map[string]any)["outcomes"])
	require.Equal(t, 2.0, ops["delete"].(map[string]any)["requests"])
	require.Equal(t, map[string]any{"full": 3.0}, ops["store"].(map[string]any)["outcomes"])
	for k, want := range map[string]any{
		"capacity_limit": float64(1 << 20), "usage": 12345.0, "evictor": true, "evictor_holder": "host pid 7",
		"evicted": 6.0, "evicted_bytes": 7.0, "scans": 8.0, "scan_blocks": 9.0, "dirs_rescanned": 10.0,
		"touches": 11.0, "touches_dropped": 12.0,
	} {
		require.Equal(t, want, got[k], k)
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

// TestDefaultRings: without rings=, a tier opened through the C ABI has a
// ring fewer than the Ps (at least 1, at most 8), so that the caller's own
// thread keeps a CPU; rings= still sets any count.
func TestDefaultRings(t *testing.T) {
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 2, 8: 7, 9: 8, 64: 8} {
		require.Equal(t, want, defaultRings(procs), "%d Ps", procs)
	}
	for _, tc := range []struct {
		options string
		want    int
	}{
		{"block_size=4096 engine=uring", defaultRings(runtime.GOMAXPROCS(0))},
		{"block_size=4096 engine=uring rings=2", 2},
	} {
		h, err := open(t.TempDir(), tc.options, nil, 0)
		require.NoError(t, err)
		c, err := acquire(h)
		require.NoError(t, err)
		got := c.t.Engine().Rings
		c.mu.RUnlock()
		require.NoError(t, free(h))
		require.Equal(t, tc.want, got, tc.options)
	}
}

// TestCodeOfBrokenEngine: a tier whose engine failed answers submits with
// ErrBroken, which is UT_EBROKEN; it was UT_EIO, which the header gives to
// ut_open alone.
func TestCodeOfBrokenEngine(t *testing.T) {
	err := fmt.Errorf("%w: io_uring_enter: %w", tier.ErrBroken, syscall.EBADF)
	require.Equal(t, utEBroken, int(code(err)))
	require.NotEqual(t, utEIO, utEBroken)
}
