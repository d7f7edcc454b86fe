package linux_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
)

// TestReleaseBeforePoll: a load's open succeeds and its read hangs; the key
// times out (so the owner did not block in the read), and the kernel gives
// the buffer back before the caller polls. The Result then says Held 0, no
// OpRelease follows, and the request's slot is freed once: a regression
// test for a slot that went back to the free list twice.
func TestReleaseBeforePoll(t *testing.T) {
	needRoot(t, "FUSE")
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		fsys := mountFaultFS(t)
		tr := openTier(t, kind, fsys.Mountpoint(), func(o *tier.Options) {
			o.IOTimeout, o.Depth, o.Rings = 100*time.Millisecond, 2, 1
		})
		if kind == tier.EngineURing {
			// FUSE may block a read issued inline (it did: the owner waited
			// in io_uring_enter for the hung read), so reads go to workers.
			assert.Equal(t, "fuse", tr.Engine().FS)
			assert.False(t, tr.Engine().Inline)
			assert.False(t, tr.Engine().StoresSync, "stores stay on the ring where the filesystem may block")
		}
		require.NoError(t, tr.BlockStore().Put(tr.Namespace(), key(1), payload(1, blockSize)))
		rule, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpRead, Path: "*", Hang: true})
		require.NoError(t, err)

		buf := make([]byte, blockSize)
		require.NoError(t, tr.Load(1, keys(1), [][]byte{buf}))
		require.Eventually(t, func() bool { return tr.Stats().Held == 1 }, 5*time.Second, time.Millisecond,
			"the load never timed out holding its buffer")
		require.Positive(t, rule.Fired(), "the read never reached the filesystem")
		rule.Release()
		require.Eventually(t, func() bool { return tr.Stats().Held == 0 }, 5*time.Second, time.Millisecond,
			"the late completion never came back")

		res := make([]tier.Result, 4)
		require.Equal(t, 1, tr.Poll(res), "exactly the Result, no OpRelease")
		assert.Equal(t, uint64(1), res[0].Req)
		assert.Equal(t, tier.OpLoad, res[0].Op)
		assert.Equal(t, 0, res[0].Held)
		assert.Equal(t, tier.StatusTimedOut, res[0].Keys[0].Status)
		assert.Zero(t, tr.Poll(res))

		// Depth 2: two new requests fit, a third does not, and both report.
		require.NoError(t, tr.Lookup(2, keys(1)))
		require.NoError(t, tr.Lookup(3, keys(2)))
		assert.ErrorIs(t, tr.Lookup(4, keys(3)), tier.ErrBusy)
		got := await(t, tr, 2, 3)
		assert.Equal(t, []tier.Status{tier.StatusFound}, statuses(got[2]))
		assert.Equal(t, []tier.Status{tier.StatusMissing}, statuses(got[3]))
	})
}
