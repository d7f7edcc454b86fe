package tier

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCancelDuringSubmit: a Cancel that returns true while its request's
// submit call is still copying the keys holds: the keys cannot start (the
// shard's only op slot is held by a blocked lookup), so every key ends
// StatusCanceled. (submitTo once reset the flag after publishing the
// request in byID and dropping t.mu, and the cancel was lost.)
func TestCancelDuringSubmit(t *testing.T) {
	var gate atomic.Pointer[chan struct{}]
	blocker := testKey(1 << 30)
	poolRun = func(o *op, _ bool) {
		if bytes.Equal(o.keyBytes(), blocker) {
			if g := gate.Load(); g != nil {
				<-*g
			}
		}
	}
	t.Cleanup(func() { poolRun = nil })
	tr := openTier(t, EngineSync, t.TempDir(), func(o *Options) { o.Rings, o.OpsMax = 1, 1 })
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = testKey(i)
	}
	lost := 0
	for iter := range 50 {
		g := make(chan struct{})
		gate.Store(&g)
		blk, req := uint64(1000+2*iter), uint64(1001+2*iter)
		require.NoError(t, tr.Lookup(blk, [][]byte{blocker}))
		require.Eventually(t, func() bool { return tr.Stats().InFlight == 1 }, 5*time.Second, time.Millisecond)
		var wg sync.WaitGroup
		var canceled atomic.Bool
		wg.Add(1)
		go func() {
			defer wg.Done()
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
				if tr.Cancel(req) {
					canceled.Store(true)
					return
				}
			}
		}()
		require.NoError(t, tr.Lookup(req, keys))
		wg.Wait()
		require.True(t, canceled.Load(), "Cancel never saw the request")
		close(g) // only now may request req's keys start
		r := await(t, tr, blk, req)[req]
		n := 0
		for _, k := range r.Keys {
			if k.Status != StatusCanceled {
				n++
			}
		}
		if n > 0 {
			lost++
			t.Logf("iteration %d: Cancel returned true before any key could start, yet %d of %d keys ended %v", iter, n, len(keys), r.Keys[0].Status)
			break
		}
	}
	require.Zero(t, lost, "iterations whose Cancel (returned true) was lost")
}

// TestLookupCacheLoadEndsAfterDelete: a load that read a block before its
// delete, and finishes after it, does not write "found" into the lookup
// cache over what the delete taught it. It once did: a lookup submitted
// after both Results were polled reported the deleted block Found, and a
// store of it was answered StatusPresent without writing.
func TestLookupCacheLoadEndsAfterDelete(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	judgeAllAside(t, func() {
		if once.CompareAndSwap(false, true) {
			close(started)
			<-release
		}
	})
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings, o.LookupCacheTTL = 1, time.Minute })
	put(t, tr, 0)
	buf := make([]byte, testBlockSize)
	require.NoError(t, tr.Load(1, testKeys(0), [][]byte{buf}))
	judging(t, started) // the block is read; its checksum waits
	require.NoError(t, tr.Delete(2, testKeys(0)))
	require.Equal(t, []Status{StatusDeleted}, statuses(await(t, tr, 2)[2]))
	close(release)
	require.Equal(t, []Status{StatusLoaded}, statuses(await(t, tr, 1)[1]))
	_, err := os.Stat(blockFile(tr, 0))
	require.ErrorIs(t, err, os.ErrNotExist)

	require.NoError(t, tr.Lookup(3, testKeys(0)))
	lookup := statuses(await(t, tr, 3)[3])
	require.NoError(t, tr.Store(4, testKeys(0), [][]byte{testPayload(0)}))
	store := statuses(await(t, tr, 4)[4])
	_, err = os.Stat(blockFile(tr, 0))
	t.Logf("after the delete: lookup %v, store %v, file there: %v", lookup, store, err == nil)
	require.Equal(t, []Status{StatusMissing}, lookup, "lookup of a deleted block (both Results polled)")
	require.Equal(t, []Status{StatusStored}, store, "store of a deleted block")
	require.NoError(t, err, "the block a store reported there")
}

// TestLookupAfterChangeStartsItsOwn: a lookup submitted once a store or a
// delete of its key has its Result does not share the answer of a lookup
// that looked before the change and is still in flight. It once did: the
// deleted block was reported Found, the stored one Missing.
func TestLookupAfterChangeStartsItsOwn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before Status // what the lookup in flight finds
		change func(tr *Tier, req uint64) error
		after  Status
	}{
		{"delete", StatusFound, func(tr *Tier, req uint64) error { return tr.Delete(req, testKeys(0)) }, StatusMissing},
		{"store", StatusMissing, func(tr *Tier, req uint64) error { return tr.Store(req, testKeys(0), [][]byte{testPayload(0)}) }, StatusFound},
	} {
		for _, ttl := range []time.Duration{-1, time.Minute} {
			t.Run(fmt.Sprintf("%s/cache=%v", tc.name, ttl > 0), func(t *testing.T) {
				lookupAfterChange(t, ttl, tc.before, tc.after, tc.change)
			})
		}
	}
}

func lookupAfterChange(t *testing.T, ttl time.Duration, before, after Status, change func(tr *Tier, req uint64) error) {
	held, release := holdFirstLookup(t)
	tr := openTier(t, EngineSync, t.TempDir(), func(o *Options) { o.Rings, o.LookupCacheTTL = 1, ttl })
	if before == StatusFound {
		put(t, tr, 0)
	}
	require.NoError(t, tr.Lookup(1, testKeys(0)))
	held() // the lookup has its answer; the owner does not know it yet
	require.NoError(t, change(tr, 2))
	require.NotEqual(t, StatusFailed, await(t, tr, 2)[2].Keys[0].Status)
	require.NoError(t, tr.Lookup(3, testKeys(0)))
	time.Sleep(10 * time.Millisecond) // the owner takes lookup 3 in
	close(release)
	got := await(t, tr, 1, 3)
	require.Equal(t, []Status{before}, statuses(got[1]), "the lookup that looked before the change")
	require.Equal(t, []Status{after}, statuses(got[3]), "the lookup submitted after the change's Result")
}

// TestInvalidateLookupsInFlight: a lookup that looked before
// InvalidateLookups and ends after it neither answers a lookup submitted
// after the call nor leaves its answer in the emptied cache. Another
// process stores the block between the look and the call. It once did
// both: the stored block was reported Missing.
func TestInvalidateLookupsInFlight(t *testing.T) {
	for _, join := range []bool{false, true} {
		t.Run(fmt.Sprintf("submitted-while-in-flight=%v", join), func(t *testing.T) {
			held, release := holdFirstLookup(t)
			dir := t.TempDir()
			tr := openTier(t, EngineSync, dir, func(o *Options) { o.Rings, o.LookupCacheTTL = 1, time.Minute })
			other := openTier(t, EngineSync, dir, func(o *Options) { o.LookupCacheTTL = -1 })
			require.NoError(t, tr.Lookup(1, testKeys(0)))
			held()
			put(t, other, 0)
			tr.InvalidateLookups()
			if join {
				require.NoError(t, tr.Lookup(3, testKeys(0)))
				time.Sleep(10 * time.Millisecond) // the owner takes lookup 3 in
				close(release)
				got := await(t, tr, 1, 3)
				require.Equal(t, []Status{StatusMissing}, statuses(got[1]), "the lookup that looked before the store")
				require.Equal(t, []Status{StatusFound}, statuses(got[3]), "the lookup submitted after InvalidateLookups")
				return
			}
			// The owner takes a request in, and so learns of the call,
			// before the lookup in flight ends.
			require.NoError(t, tr.Lookup(2, testKeys(1)))
			require.Equal(t, []Status{StatusMissing}, statuses(await(t, tr, 2)[2]))
			close(release)
			require.Equal(t, []Status{StatusMissing}, statuses(await(t, tr, 1)[1]), "the lookup that looked before the store")
			require.NoError(t, tr.Lookup(3, testKeys(0)))
			require.Equal(t, []Status{StatusFound}, statuses(await(t, tr, 3)[3]), "the lookup submitted after InvalidateLookups")
		})
	}
}

// holdFirstLookup holds the sync engine worker that runs the next lookup
// once its program has its outcome, before the owner learns of it: held
// waits until the worker is there, release lets it go.
func holdFirstLookup(t *testing.T) (held func(), release chan struct{}) {
	at, release := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	poolRan = func(o *op) {
		if o.kind == OpLookup && once.CompareAndSwap(false, true) {
			close(at)
			<-release
		}
	}
	t.Cleanup(func() { poolRan = nil })
	return func() {
		select {
		case <-at:
		case <-time.After(5 * time.Second):
			t.Fatal("the lookup did not run")
		}
	}, release
}
