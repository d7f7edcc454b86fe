package tier

import (
	"context"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSubmitChunks counts the io_uring engine's submissions of a
// 1,024-key lookup batch on a local filesystem. O_PATH opens go to the
// kernel submitChunk SQEs at a time, whatever the ring count (with a ring
// per P the owner also yields its P after each chunk, so that the caller
// finds one), and what completed inline gives its op slot back before the
// next keys start: a batch of found keys cycles through a few slots, not
// one each. STATX lookups, which all go to kernel workers, are submitted
// whole: chunks would wake the workers once each. (Their batch has 384
// keys, under lookupsMax a ring: with more, those past it start as others
// complete, in as many submissions as the completions come in: 5 to 66
// were seen with 1,024.)
func TestSubmitChunks(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	var submits atomic.Int64
	ringFault = func(sqes uint32) error {
		if sqes > 0 {
			submits.Add(1)
		}
		return nil
	}
	t.Cleanup(func() { ringFault = nil })
	for _, c := range []struct {
		rings     int
		lookup    LookupOp
		n         int   // keys in the batch, half of them there
		atLeast   int64 // submissions that hand SQEs over
		fewerThan int64
	}{
		// O_PATH: at least half the chunks a batch makes, a margin for
		// how the hash splits keys between two rings.
		{rings: 1, lookup: LookupOpenPath, n: 1024, atLeast: 1024 / submitChunk / 2, fewerThan: 1 << 20},
		{rings: 2, lookup: LookupOpenPath, n: 1024, atLeast: 1024 / submitChunk / 2, fewerThan: 1 << 20},
		// STATX: whole batches; chunks would make 12.
		{rings: 2, lookup: LookupStatx, n: 384, atLeast: 1, fewerThan: 8},
	} {
		keys := seq(0, c.n)
		tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) {
			o.Rings, o.OpsMax, o.Lookup = c.rings, len(keys), c.lookup
		})
		require.Equal(t, c.lookup == LookupStatx, tr.Engine().OwnThreads)
		put(t, tr, keys[:len(keys)/2]...)
		submits.Store(0)
		require.NoError(t, tr.Lookup(1, testKeys(keys...)))
		r := await(t, tr, 1)[1]
		for i, k := range r.Keys {
			want := StatusMissing
			if i < len(keys)/2 {
				want = StatusFound
			}
			require.Equal(t, want, k.Status, "rings %d %v, key %d", c.rings, c.lookup, i)
		}
		n := submits.Load()
		t.Logf("rings %d %v: %d submissions", c.rings, c.lookup, n)
		assert.GreaterOrEqual(t, n, c.atLeast, "rings %d %v: submissions", c.rings, c.lookup)
		assert.Less(t, n, c.fewerThan, "rings %d %v: submissions", c.rings, c.lookup)
		if c.lookup != LookupOpenPath {
			continue
		}

		// Found keys, their dentries cached: every open completes inline.
		mark := time.Now()
		require.NoError(t, tr.Lookup(2, testKeys(keys[:len(keys)/2]...)))
		for i, k := range await(t, tr, 2)[2].Keys {
			require.Equal(t, StatusFound, k.Status, "rings %d, key %d", c.rings, i)
		}
		for _, s := range tr.shards {
			used := 0
			for j := range s.ops {
				if s.ops[j].started.After(mark) {
					used++
				}
			}
			t.Logf("rings %d: ring %d used %d op slots", c.rings, s.idx, used)
			assert.Positive(t, used, "rings %d, ring %d", c.rings, s.idx)
			assert.LessOrEqual(t, used, 2*submitChunk, "rings %d, ring %d: op slots used by %d found keys", c.rings, s.idx, len(keys)/2)
		}
	}
}

// TestColdLookupsAskStatxFirst: once a ring's cached-first opens have
// missed the dentry cache coldRun times in a row (caches dropped), its
// lookups go to STATX at once, all but one in coldProbe+1 (without it, every
// cold key made an open and a STATX: twice the SQEs); with the tree in the
// cache again, two probes in a row that the cache answers end that, and the
// rest of the lookups are opens again.
func TestColdLookupsAskStatxFirst(t *testing.T) {
	const n = 512
	be, lookup := coldRing(t, n)
	cold := lookup(1, seq(0, n))
	t.Logf("cold: %d SQEs for %d keys; uncached %d", cold, n, be.uncached)
	// A STATX a key, the opens before the run was long enough, and the
	// probes: 1.2 a key; an open and a STATX a key would be 2.
	assert.Less(t, cold, int64(n*3/2), "SQEs of cold lookups")
	assert.GreaterOrEqual(t, be.uncached, coldRun, "the ring is cold")

	warm := lookup(2, seq(0, n))
	t.Logf("warm: %d SQEs for %d keys; uncached %d", warm, n, be.uncached)
	assert.Equal(t, 0, be.uncached, "probes that the cache answered ended the cold run")
	assert.Equal(t, int64(n), warm, "an SQE a key")
}

// TestColdLookupsStayColdInAPartlyCachedTree: with one path in 7 in the
// dentry cache (looked up after the caches were dropped), a cold run's
// probes find their path now and then; such a probe no longer ends the
// run, whose every cached-first open after it missed six times in seven
// and was asked again by STATX (924 SQEs for the 512 keys). A ring that is
// not cold there becomes so: a hit no longer takes the count of misses
// back to 0, and 64 misses in a row were rare.
func TestColdLookupsStayColdInAPartlyCachedTree(t *testing.T) {
	const n = 512
	be, lookup := coldRing(t, n)
	var some []int
	for i := 0; i < n; i += 7 { // not a multiple of the probes' stride, or none or all would be cached
		some = append(some, i)
	}
	lookup(1, some) // their paths in the cache, and the ring cold
	require.GreaterOrEqual(t, be.uncached, coldRun, "the first lookups made the ring cold")
	got := lookup(2, seq(0, n))
	t.Logf("%d SQEs for %d keys, one path in 7 cached; uncached %d", got, n, be.uncached)
	assert.Less(t, got, int64(n*5/4), "SQEs of lookups in a partly cached tree")
	assert.GreaterOrEqual(t, be.uncached, coldRun, "still cold")

	// The same tree from a ring that is not cold.
	unix.Sync()
	require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("2\n"), 0))
	lookup(3, some)
	be.uncached, be.probeHit = 0, false // the owner is idle: the next submit publishes this to it
	got = lookup(4, seq(0, n))
	t.Logf("from warm: %d SQEs for %d keys, one path in 7 cached; uncached %d", got, n, be.uncached)
	assert.GreaterOrEqual(t, be.uncached, coldRun, "went cold")
}

// coldRing opens a tier with one ring, stores keys 0..n-1 and drops the
// dentry cache. lookup looks up keys, requires each found, and returns the
// SQEs that the lookups handed to the kernel.
func coldRing(t *testing.T, n int) (*uringBackend, func(req uint64, keys []int) int64) {
	var sqes atomic.Int64
	ringFault = func(n uint32) error {
		sqes.Add(int64(n))
		return nil
	}
	t.Cleanup(func() { ringFault = nil })
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings, o.OpsMax = 1, n })
	put(t, tr, seq(0, n)...)
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2\n"), 0); err != nil {
		t.Skipf("cannot drop the dentry cache: %v", err)
	}
	return tr.shards[0].be.(*uringBackend), func(req uint64, keys []int) int64 {
		t.Helper()
		sqes.Store(0)
		require.NoError(t, tr.Lookup(req, testKeys(keys...)))
		for i, k := range await(t, tr, req)[req].Keys {
			require.Equal(t, StatusFound, k.Status, "request %d, key %d: %v", req, i, k.Err)
		}
		return sqes.Load()
	}
}

// TestLockedOwnerWithSpareP runs an owner locked to its thread (STATX
// lookups) with fewer rings than Ps, where it sleeps in io_uring_enter and
// a caller's wake is its waker's READ completing, and with a ring per P,
// where it sleeps on the ring's eventfd. Each time the owner is left to
// fall asleep before a request comes, and every request is answered well
// before the owner's idle sleep (a second) would have ended by itself.
func TestLockedOwnerWithSpareP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	const woken = 500 * time.Millisecond
	for _, rings := range []int{1, 2} {
		tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) {
			o.Rings, o.Lookup = rings, LookupStatx
		})
		require.True(t, tr.Engine().OwnThreads)
		be := tr.shards[0].be.(*uringBackend)
		assert.Equal(t, rings == 1, be.waker != nil, "rings %d: a waker, to end a sleep in io_uring_enter", rings)
		assert.Equal(t, rings != 1, be.evfd != nil, "rings %d: an eventfd, to sleep on in the netpoller", rings)
		put(t, tr, 0, 1)
		for req := uint64(1); req <= 3; req++ {
			time.Sleep(20 * time.Millisecond)
			require.NoError(t, tr.Lookup(req, testKeys(0, 1, 2)))
			assert.Equal(t, []Status{StatusFound, StatusFound, StatusMissing}, statuses(awaitWithin(t, tr, woken, req)[req]), "rings %d", rings)
		}
		time.Sleep(20 * time.Millisecond)
		bufs := [][]byte{testPayload(2)}
		require.NoError(t, tr.Store(4, testKeys(2), bufs))
		assert.Equal(t, []Status{StatusStored}, statuses(awaitWithin(t, tr, woken, 4)[4]), "rings %d", rings)
		time.Sleep(20 * time.Millisecond)
		clear(bufs[0])
		require.NoError(t, tr.Load(5, testKeys(2), bufs))
		assert.Equal(t, []Status{StatusLoaded}, statuses(awaitWithin(t, tr, woken, 5)[5]), "rings %d", rings)
		assert.Equal(t, testPayload(2), bufs[0], "rings %d", rings)
		require.NoError(t, tr.Close(context.Background()))
	}
}
