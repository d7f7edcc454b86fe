package tier

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLazyStoreTakenIn: a store submitted while an op of its ring is in
// the kernel does not wake the owner (shard.enqueue); if that op was the
// last and completes before the owner sleeps, the owner must take the
// store in rather than sleep until its next timer (a second). The store
// is submitted from the owner's own goroutine just as the first op of a
// lookup of 32 keys (submitChunk) has started: the 32 are submitted at
// once and complete inline, and the owner finishes them before it decides
// how long to sleep.
func TestLazyStoreTakenIn(t *testing.T) {
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 1 })
	keys := seq(100, 100+submitChunk)
	put(t, tr, keys...)
	// Warm: each open is then answered from the dentry cache, inline.
	require.NoError(t, tr.Lookup(1, testKeys(keys...)))
	await(t, tr, 1)
	var once sync.Once
	var storeErr error
	var submitted time.Time
	var inFlight int64
	opStarted = func(s *shard) {
		once.Do(func() {
			inFlight = s.inFlight.Load()
			submitted = time.Now()
			storeErr = tr.Store(3, testKeys(1), [][]byte{testPayload(1)})
		})
	}
	t.Cleanup(func() { opStarted = nil })
	require.NoError(t, tr.Lookup(2, testKeys(keys...)))
	res := await(t, tr, 2, 3)
	took := time.Since(submitted)
	require.Positive(t, inFlight, "no op was in flight when the store came")
	require.NoError(t, storeErr)
	for _, k := range res[2].Keys {
		require.Equal(t, StatusFound, k.Status, "%v", k.Err)
	}
	require.Equal(t, StatusStored, res[3].Keys[0].Status, "%v", res[3].Keys[0].Err)
	t.Logf("the store took %v", took)
	require.Less(t, took, 500*time.Millisecond, "the store waited for the owner's timer")
}
