package linux_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
)

// slowLatency is added to every operation of the slow filesystem.
const slowLatency = time.Millisecond

// TestSlowFilesystem adds 1 ms to every operation of a faultfs mount (a slow NFS server): lookups
// of large batches must keep many operations in flight at once (Gauges().InFlight peaks far above
// 1) and answer every key right. It logs keys/s for each engine, for a single goroutine calling
// statx in a loop on the same mount and for 64 goroutines doing so, for the report; no timing is
// asserted. The loop, the pool and each engine are timed on a second pass over the keys, after one
// that warms them up (for the engines, the checked pass); the checked pass samples Gauges every
// 200 µs, which the timed one does not (the pool has no sampler; a sampler that called Stats cost a
// tier about a fifth of its keys a second here).
func TestSlowFilesystem(t *testing.T) {
	fsys := mountFaultFS(t)
	// Half the keys exist, written straight into the backing directory (no latency).
	const n = 2048
	seedTier := openTier(t, tier.EngineSync, fsys.Backing(), nil)
	for i := 0; i < n; i += 2 {
		require.NoError(t, seedTier.BlockStore().Put(seedTier.Namespace(), key(i), payload(i, blockSize)))
	}
	rule, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpAll, Latency: slowLatency})
	require.NoError(t, err)

	// The baselines: statx of key i's path through the mount, which must find the even keys.
	nsDir := filepath.Join(fsys.Mountpoint(), seedTier.Namespace())
	statKey := func(i int) error {
		var stx unix.Statx_t
		path := filepath.Join(nsDir, string(seedTier.BlockStore().Layout().AppendPath(nil, key(i))))
		err := unix.Statx(unix.AT_FDCWD, path, unix.AT_STATX_DONT_SYNC, unix.STATX_SIZE, &stx)
		if i%2 == 0 && err != nil || i%2 == 1 && err != unix.ENOENT {
			return fmt.Errorf("statx of key %d: %v", i, err)
		}
		return nil
	}
	// One goroutine, one statx at a time, twice: the second pass is timed.
	const loopKeys = 200
	var start time.Time
	for range 2 {
		start = time.Now()
		for i := range loopKeys {
			require.NoError(t, statKey(i))
		}
	}
	loopRate := float64(loopKeys) / time.Since(start).Seconds()
	t.Logf("statx loop, 1 goroutine: %.0f keys/s", loopRate)

	// 64 goroutines calling statx over all the keys, twice: the second pass is timed.
	var poolRate float64
	for range 2 {
		start = time.Now()
		var next atomic.Int64
		var pool sync.WaitGroup
		for range 64 {
			pool.Go(func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					assert.NoError(t, statKey(i), "statx pool")
				}
			})
		}
		pool.Wait()
		poolRate = float64(n) / time.Since(start).Seconds()
	}
	t.Logf("statx pool, 64 goroutines: %.0f keys/s", poolRate)

	engines(t, func(t *testing.T, kind tier.EngineKind) {
		tr := openTier(t, kind, fsys.Mountpoint(), func(o *tier.Options) { o.OpsMax = 256 })
		const batch = 1024
		reqs := make([]uint64, n/batch)
		// pass looks every key up (request IDs from base on) and returns the results and how long
		// they took.
		pass := func(base uint64) (map[uint64]tier.Result, time.Duration) {
			start := time.Now()
			for i := range reqs {
				reqs[i] = base + uint64(i)
				require.NoError(t, tr.Lookup(reqs[i], keyRange(i*batch, (i+1)*batch)))
			}
			got := await(t, tr, reqs...)
			return got, time.Since(start)
		}

		// The checked pass, with InFlight sampled.
		var peak atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Microsecond):
				}
				if v := int64(tr.Gauges().InFlight); v > peak.Load() {
					peak.Store(v)
				}
			}
		})
		check := func(got map[uint64]tier.Result) {
			for b, req := range reqs {
				require.Len(t, got[req].Keys, batch)
				for j, k := range got[req].Keys {
					i := b*batch + j
					want := map[bool]tier.Status{true: tier.StatusFound, false: tier.StatusMissing}[i%2 == 0]
					require.Equal(t, want, k.Status, "key %d: %v", i, k.Err)
				}
			}
		}
		got, _ := pass(0)
		close(stop)
		wg.Wait()
		check(got)
		assert.GreaterOrEqual(t, peak.Load(), int64(16), "too few operations in flight at once")

		// The timed pass.
		got, took := pass(uint64(len(reqs)))
		check(got)
		rate := float64(n) / took.Seconds()
		t.Logf("%s engine: %d keys in %v: %.0f keys/s (%.1fx the statx loop, %.2fx the pool), InFlight peaked at %d",
			kind, n, took.Round(time.Millisecond), rate, rate/loopRate, rate/poolRate, peak.Load())
	})
	assert.Positive(t, rule.Fired())
}

// TestOwnerGathersCompletions: on a filesystem whose operations take long, an io_uring owner with
// many in the kernel lets their completions gather before it sleeps on the kernel, instead of
// waking for each. Lookups of n keys are held in FUSE, then answered one every 100 µs: the owners
// must sleep on the kernel (tier.Stats.KernelSleeps) far fewer times than n, and find every key.
func TestOwnerGathersCompletions(t *testing.T) {
	needRoot(t, "FUSE")
	// One ring of two CPUs (a spare P): its owner sleeps in io_uring_enter; two: on their eventfds.
	for _, rings := range []int{1, 2} {
		t.Run(fmt.Sprintf("rings=%d", rings), func(t *testing.T) { testOwnerGathers(t, rings) })
	}
}

func testOwnerGathers(t *testing.T, rings int) {
	fsys := mountFaultFS(t)
	tr := openTier(t, tier.EngineURing, fsys.Mountpoint(), func(o *tier.Options) { o.Rings, o.OpsMax, o.WorkersMax = rings, 256, 128 })
	require.False(t, tr.Engine().Inline, "FUSE: every op to a kernel worker")
	const n = 128
	paths := make([]string, n)
	for i := range n {
		require.NoError(t, tr.BlockStore().Put(tr.Namespace(), key(i), payload(i, blockSize)))
		paths[i] = filepath.Join(tr.Namespace(), string(tr.BlockStore().Layout().AppendPath(nil, key(i))))
	}

	// hold looks the n keys up with each one's lookup held in FUSE, and returns once all are held.
	hold := func(req uint64) []*faultfs.Rule {
		rules := make([]*faultfs.Rule, n)
		for i, p := range paths {
			r, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpLookup | faultfs.OpGetattr, Path: p, Hang: true})
			require.NoError(t, err)
			rules[i] = r
		}
		require.NoError(t, tr.Lookup(req, keyRange(0, n)))
		require.Eventually(t, func() bool { return fsys.Hung() == n }, 10*time.Second, time.Millisecond,
			"every lookup held in FUSE")
		return rules
	}
	found := func(res tier.Result) {
		for i, k := range res.Keys {
			require.Equal(t, tier.StatusFound, k.Status, "key %d: %v", i, k.Err)
		}
	}
	// Once, all answered together 30 ms on: the owner learns that ops take long here, and sleeps
	// on the kernel meanwhile (the count counts).
	rules := hold(1)
	time.Sleep(30 * time.Millisecond)
	require.Positive(t, tr.Stats().KernelSleeps, "the owners slept on the kernel while 30 ms passed")
	for _, r := range rules {
		r.Remove()
	}
	found(await(t, tr, 1)[1])

	rules = hold(2)
	before := tr.Stats().KernelSleeps
	for _, r := range rules {
		r.Remove()
		// A system call's sleep: the runtime's own ends on its next timer check, up to a ms here.
		unix.Nanosleep(&unix.Timespec{Nsec: 100_000}, nil)
	}
	found(await(t, tr, 2)[2])
	sleeps := tr.Stats().KernelSleeps - before
	t.Logf("%d completions, one every 100 µs: the owners slept on the kernel %d times", n, sleeps)
	assert.LessOrEqual(t, sleeps, uint64(n/4), "the owner woke for nearly every completion")
}
