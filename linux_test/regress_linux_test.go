package linux_test

import (
	"context"
	"errors"
	"io/fs"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/tier"
)

// TestCloseExpiredContextReleases closes a tier on a healthy disk with an
// already expired context while loads and stores are in flight. Close gives
// up on them at once (ErrStuck), but the kernel finishes them within
// moments, and then every descriptor, ring, goroutine and buffer of the tier
// must be gone. The io_uring engine used to keep two descriptors per ring
// (its waker and its namespace directory) for good.
func TestCloseExpiredContextReleases(t *testing.T) {
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		dir := t.TempDir()
		goroutines := goleak.IgnoreCurrent()
		fds0, rings0 := openFDs(t)
		tr, err := tier.Open(dir, tier.Options{BlockSize: blockSize, Engine: kind, Rings: 2, Buffers: 4})
		require.NoError(t, err)
		const n = 256
		bufs := make([][]byte, n)
		for i := range bufs {
			bufs[i] = payload(i, blockSize)
		}
		require.NoError(t, tr.Store(1, keyRange(0, n), bufs))
		lbufs := make([][]byte, n)
		for i := range lbufs {
			lbufs[i] = make([]byte, blockSize)
		}
		require.NoError(t, tr.Load(2, keyRange(n, 2*n), lbufs))

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		closeErr := tr.Close(ctx)
		// Results and OpReleases are polled together: the kernel may let
		// go of a buffer before the other request's Result is in.
		res := map[uint64]tier.Result{}
		released := map[uint64]int{}
		buf := make([]tier.Result, 4)
		pollAll := func() {
			for n := tr.Poll(buf); n > 0; n = tr.Poll(buf) {
				for _, r := range buf[:n] {
					if r.Op == tier.OpRelease {
						released[r.Req]++
						continue
					}
					_, dup := res[r.Req]
					require.False(t, dup, "two results for request %d", r.Req)
					res[r.Req] = r
				}
			}
		}
		deadline := time.Now().Add(20 * time.Second)
		for len(res) < 2 {
			require.True(t, time.Now().Before(deadline), "results of requests 1 and 2 never came")
			pollAll()
			time.Sleep(time.Millisecond)
		}
		held := 0
		for _, r := range res {
			held += r.Held
		}
		t.Logf("Close: %v; buffers held at Close: %d", closeErr, held)
		if closeErr != nil {
			require.ErrorIs(t, closeErr, tier.ErrStuck)
		}

		// Everything goes once the kernel has answered: within seconds on
		// a healthy disk. The counts are polled, not timed.
		for {
			fds, rings := openFDs(t)
			if fds == fds0 && rings == rings0 && goleak.Find(goroutines) == nil {
				break
			}
			if time.Now().After(deadline) {
				require.Equal(t, fds0, fds, "descriptors after the kernel let go")
				require.Equal(t, rings0, rings, "io_uring instances after the kernel let go")
				goleak.VerifyNone(t, goroutines)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Each Result polled with Held > 0 is followed by exactly one
		// OpRelease, which Poll returns after Close.
		pollAll()
		owed := map[uint64]int{}
		for id, r := range res {
			if r.Held > 0 {
				owed[id] = 1
			}
		}
		assert.Equal(t, owed, released, "OpReleases per request")
	})
}

// TestStoreReportsFirstCause stores into a filesystem remounted read-only
// under a running tier: the directory the block needs cannot be created.
// Both engines report the cause, EROFS, not the ENOENT of the open that
// followed it (the io_uring engine used to skip its MKDIRAT results).
func TestStoreReportsFirstCause(t *testing.T) {
	needRoot(t, "mounting a tmpfs")
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		dir := t.TempDir()
		require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"), "mount a tmpfs on %s", dir)
		t.Cleanup(func() { require.NoError(t, unix.Unmount(dir, unix.MNT_DETACH)) })
		tr := openTier(t, kind, dir, nil)
		require.NoError(t, unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""), "remount read-only")
		require.NoError(t, tr.Store(1, keys(0), [][]byte{payload(0, blockSize)}))
		k := await(t, tr, 1)[1].Keys[0]
		require.Equal(t, tier.StatusFailed, k.Status)
		var pe *fs.PathError
		require.True(t, errors.As(k.Err, &pe), "%T is not an *fs.PathError: %v", k.Err, k.Err)
		require.ErrorIs(t, k.Err, syscall.EROFS, "the first cause")
		t.Logf("%v: %v", kind, k.Err)
	})
}
