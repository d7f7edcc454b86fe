package tier

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBrokenRingFailsTheTier makes the kernel refuse a submission with an
// error no retry helps (EBADFD, as for a ring torn down under the tier):
// the process goes on, every key in flight ends StatusFailed wrapping
// ErrBroken and the cause, later submits fail at once, Stats and Engine
// say why, and Close returns. The io_uring engine used to panic.
func TestBrokenRingFailsTheTier(t *testing.T) {
	var armed atomic.Bool
	var fired atomic.Int64
	ringFault = func() error {
		if armed.Load() {
			fired.Add(1)
			return syscall.EBADFD
		}
		return nil
	}
	t.Cleanup(func() { ringFault = nil })
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 1 })
	put(t, tr, 0, 1, 2, 3)
	require.NoError(t, tr.Lookup(1, testKeys(0, 1, 2, 3)))
	assert.Equal(t, []Status{StatusFound, StatusFound, StatusFound, StatusFound}, statuses(await(t, tr, 1)[1]))

	armed.Store(true)
	bufs := [][]byte{make([]byte, testBlockSize), make([]byte, testBlockSize), make([]byte, testBlockSize), make([]byte, testBlockSize)}
	require.NoError(t, tr.Load(2, testKeys(0, 1, 2, 3), bufs))
	for i, k := range await(t, tr, 2)[2].Keys {
		assert.Equal(t, StatusFailed, k.Status, "key %d", i)
		assert.ErrorIs(t, k.Err, ErrBroken, "key %d", i)
		assert.ErrorIs(t, k.Err, syscall.EBADFD, "key %d", i)
	}
	require.Positive(t, fired.Load(), "the fault was not injected")

	err := tr.Lookup(3, testKeys(0))
	require.ErrorIs(t, err, ErrBroken, "a submit after the failure")
	assert.ErrorIs(t, err, syscall.EBADFD)
	assert.Contains(t, tr.Engine().Broken, "engine broken")
	assert.Contains(t, tr.Stats().Engine.Broken, "file descriptor in bad state")
	require.NoError(t, tr.Close(context.Background()))
}
