package linux_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/tier"
)

// TestFullDisk stores into a 1 MiB tmpfs through the page cache, and with O_DIRECT from the tier's
// buffers into a 4 MiB ext4 (where the io_uring engine's store pool allocates a file's blocks
// before its write goes on the ring): the stores that do not fit end StatusFull with a per-key
// error wrapping ENOSPC while the others succeed, nothing partial is visible (no temporary file, no
// corrupt block), and after deleting the others the failed stores succeed.
func TestFullDisk(t *testing.T) {
	const size = 64 << 10 // 16 blocks of 68 KiB files would need 1.06 MiB
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) { fullDisk(t, size, direct) })
	}
}

func fullDisk(t *testing.T, size int, direct bool) {
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		dir, n := mountTmpfs(t, 1<<20), 24
		if direct {
			dir, n = mountExt4Of(t, 4<<20), 64 // about 2.4 MiB free: 36 files of 68 KiB
		}
		tr := openTier(t, kind, dir, func(o *tier.Options) { o.BlockSize, o.Buffers, o.NoDirect = size, n, !direct })
		require.Equal(t, direct, tr.Engine().Direct, "the probe: %s", tr.Engine().NoDirect)
		ns := tr.Namespace()

		bufs := make([][]byte, n)
		for i := range bufs {
			bufs[i] = payload(i, size)
			if direct {
				bufs[i] = append(tr.Buffers()[i][:0], bufs[i]...) // aligned: O_DIRECT
			}
		}
		require.NoError(t, tr.Store(1, keyRange(0, n), bufs))
		r := await(t, tr, 1)[1]
		var stored, failed []int
		for i, k := range r.Keys {
			switch k.Status {
			case tier.StatusStored:
				stored = append(stored, i)
			case tier.StatusFull:
				var pe *fs.PathError
				require.True(t, errors.As(k.Err, &pe), "key %d: %T is not an *fs.PathError: %v", i, k.Err, k.Err)
				require.ErrorIs(t, k.Err, syscall.ENOSPC, "key %d", i)
				failed = append(failed, i)
			default:
				t.Fatalf("key %d: %v %v", i, k.Status, k.Err)
			}
		}
		t.Logf("stored %d, failed with ENOSPC %d; e.g. %v", len(stored), len(failed), r.Keys[failed[0]].Err)
		require.NotEmpty(t, stored, "nothing fitted")
		require.NotEmpty(t, failed, "the disk did not fill up")

		// Nothing partial: no temporary file; exactly the stored blocks are visible, and whole.
		assert.Empty(t, tempFiles(t, tr.BlockStore(), ns))
		vs := verifyClean(t, tr.BlockStore(), ns, "after ENOSPC")
		assert.Equal(t, int64(len(stored)), vs.Blocks)
		for _, i := range failed {
			ok, err := tr.BlockStore().Has(ns, key(i))
			require.NoError(t, err)
			assert.False(t, ok, "failed block %d is visible", i)
		}

		// Delete everything, then the failed stores go through.
		require.NoError(t, tr.Delete(9, keys(stored...)))
		for _, s := range statuses(await(t, tr, 9)[9]) {
			require.Equal(t, tier.StatusDeleted, s)
		}
		retry := failed[:min(len(failed), len(stored))]
		rbufs := make([][]byte, len(retry))
		for j, i := range retry {
			rbufs[j] = bufs[i]
		}
		require.NoError(t, tr.Store(2, keys(retry...), rbufs))
		r = await(t, tr, 2)[2]
		for j, k := range r.Keys {
			require.Equal(t, tier.StatusStored, k.Status, "key %d after the deletes: %v", retry[j], k.Err)
		}
		loaded := buffers(len(retry), size)
		require.NoError(t, tr.Load(3, keys(retry...), loaded))
		r = await(t, tr, 3)[3]
		for j, k := range r.Keys {
			require.Equal(t, tier.StatusLoaded, k.Status, "key %d: %v", retry[j], k.Err)
			require.True(t, bytes.Equal(bufs[retry[j]], loaded[j]), "key %d: wrong bytes", retry[j])
		}
	})
}
