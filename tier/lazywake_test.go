package tier

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLazyWakeTakenIn: a store or load submitted while an op of its ring
// is in the kernel does not wake the owner (shard.enqueue); if that op was
// the last and completes before the owner sleeps, the owner must take the
// request in rather than sleep until its next timer (a second). The
// request is submitted from the owner's own goroutine just as the first
// op of a lookup of 32 keys (submitChunk) has started: the 32 are
// submitted at once and complete inline, and the owner finishes them
// before it decides how long to sleep.
func TestLazyWakeTakenIn(t *testing.T) {
	for _, op := range []Op{OpStore, OpLoad} {
		t.Run(op.String(), func(t *testing.T) {
			tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 1 })
			keys := seq(100, 100+submitChunk)
			put(t, tr, keys...)
			put(t, tr, 1)
			// Warm: each open is then answered from the dentry cache, inline.
			require.NoError(t, tr.Lookup(1, testKeys(keys...)))
			await(t, tr, 1)
			var once sync.Once
			var err error
			var submitted time.Time
			var inFlight int64
			buf := make([]byte, testBlockSize)
			opStarted = func(s *shard) {
				once.Do(func() {
					inFlight = s.inFlight.Load()
					submitted = time.Now()
					if op == OpStore {
						err = tr.Store(3, testKeys(2), [][]byte{testPayload(2)})
					} else {
						err = tr.Load(3, testKeys(1), [][]byte{buf})
					}
				})
			}
			t.Cleanup(func() { opStarted = nil })
			require.NoError(t, tr.Lookup(2, testKeys(keys...)))
			res := await(t, tr, 2, 3)
			took := time.Since(submitted)
			require.Positive(t, inFlight, "no op was in flight when the %v came", op)
			require.NoError(t, err)
			for _, k := range res[2].Keys {
				require.Equal(t, StatusFound, k.Status, "%v", k.Err)
			}
			want := StatusStored
			if op == OpLoad {
				want = StatusLoaded
				require.Equal(t, testPayload(1), buf)
			}
			require.Equal(t, want, res[3].Keys[0].Status, "%v", res[3].Keys[0].Err)
			t.Logf("the %v took %v", op, took)
			require.Less(t, took, 500*time.Millisecond, "the %v waited for the owner's timer", op)
		})
	}
}
