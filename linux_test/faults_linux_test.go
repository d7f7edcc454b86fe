package linux_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
)

// blockRel is key i's block file relative to the mount root, as faultfs sees it.
func blockRel(tr *tier.Tier, i int) string {
	return tr.Namespace() + "/" + string(tr.BlockStore().Layout().AppendPath(nil, key(i)))
}

// requireErrno asserts that k failed with an *fs.PathError wrapping errno.
func requireErrno(t *testing.T, k tier.KeyResult, errno syscall.Errno, msg string) {
	t.Helper()
	require.Equal(t, tier.StatusFailed, k.Status, "%s: %v", msg, k.Err)
	var pe *fs.PathError
	require.True(t, errors.As(k.Err, &pe), "%s: %T is not an *fs.PathError: %v", msg, k.Err, k.Err)
	require.ErrorIs(t, k.Err, errno, msg)
	require.NotContains(t, pe.Path, "\x00", "%s: the path in the error", msg)
	require.Contains(t, pe.Path, ".blk", "%s: the path in the error names the block", msg)
	t.Logf("%s: %v", msg, k.Err)
}

// TestFailingFilesystem injects EIO and ESTALE on some blocks' paths: EIO fails those keys with an
// *fs.PathError wrapping it, while ESTALE (another host replaced or removed the block) makes a load
// walk the path again once and, if it persists, reports the block missing; the other keys of the same
// request succeed.
func TestFailingFilesystem(t *testing.T) {
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		fsys := mountFaultFS(t)
		tr := openTier(t, kind, fsys.Mountpoint(), nil)
		// Blocks 0..5 exist; 7 does not.
		for i := range 6 {
			require.NoError(t, tr.BlockStore().Put(tr.Namespace(), key(i), payload(i, blockSize)))
		}

		t.Run("lookup", func(t *testing.T) {
			eio, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpLookup, Path: blockRel(tr, 0), Errno: syscall.EIO})
			require.NoError(t, err)
			estale, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpLookup, Path: blockRel(tr, 2), Errno: syscall.ESTALE})
			require.NoError(t, err)
			defer fsys.Reset()
			require.NoError(t, tr.Lookup(1, keys(0, 1, 2, 3, 7)))
			r := await(t, tr, 1)[1]
			requireErrno(t, r.Keys[0], syscall.EIO, "lookup of key 0")
			assert.NoError(t, r.Keys[2].Err, "lookup of key 2")
			assert.Equal(t, []tier.Status{tier.StatusFailed, tier.StatusFound, tier.StatusMissing, tier.StatusFound, tier.StatusMissing}, statuses(r))
			assert.Equal(t, 0, r.Prefix)
			assert.Positive(t, eio.Fired())
			assert.Positive(t, estale.Fired())
		})

		t.Run("load", func(t *testing.T) {
			eio, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpRead, Path: blockRel(tr, 1), Errno: syscall.EIO})
			require.NoError(t, err)
			estale, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpOpen, Path: blockRel(tr, 3), Errno: syscall.ESTALE})
			require.NoError(t, err)
			// Key 4's first read is stale, as when another host replaced the block between this
			// host's open and its read; the second walk finds the new file.
			var reads atomic.Int32
			once, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpRead, Path: blockRel(tr, 4), Errno: syscall.ESTALE,
				Filter: func(faultfs.Op) bool { return reads.Add(1) == 1 }})
			require.NoError(t, err)
			defer fsys.Reset()
			bufs := buffers(5, blockSize)
			require.NoError(t, tr.Load(2, keys(0, 1, 2, 3, 4), bufs))
			r := await(t, tr, 2)[2]
			requireErrno(t, r.Keys[1], syscall.EIO, "load of key 1")
			assert.NoError(t, r.Keys[3].Err, "load of key 3")
			assert.Equal(t, []tier.Status{tier.StatusLoaded, tier.StatusFailed, tier.StatusLoaded, tier.StatusMissing, tier.StatusLoaded}, statuses(r))
			assert.Equal(t, 1, r.Prefix)
			assert.Equal(t, payload(0, blockSize), bufs[0])
			assert.Equal(t, payload(2, blockSize), bufs[2])
			assert.Equal(t, payload(4, blockSize), bufs[4])
			assert.Positive(t, eio.Fired())
			assert.Positive(t, estale.Fired())
			assert.Equal(t, 1, int(once.Fired()), "key 4's stale read")
			assert.False(t, tr.Stats().BreakerOpen)
			// Neither an IO error nor a stale file is corruption: the blocks stay where they are.
			for _, i := range []int{1, 3, 4} {
				ok, err := tr.BlockStore().Has(tr.Namespace(), key(i))
				require.NoError(t, err)
				assert.True(t, ok, "block %d was moved", i)
			}
		})

		t.Run("store", func(t *testing.T) {
			// Writes to key 10's temporary file fail with EIO, the rename of key 11 with ESTALE.
			tmp10 := blockRel(tr, 10) + ".tmp.*"
			eio, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpWrite, Path: tmp10, Errno: syscall.EIO})
			require.NoError(t, err)
			estale, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpRename, Path: blockRel(tr, 11), Errno: syscall.ESTALE})
			require.NoError(t, err)
			defer fsys.Reset()
			bufs := [][]byte{payload(10, blockSize), payload(11, blockSize), payload(12, blockSize)}
			require.NoError(t, tr.Store(3, keys(10, 11, 12), bufs))
			r := await(t, tr, 3)[3]
			requireErrno(t, r.Keys[0], syscall.EIO, "store of key 10")
			requireErrno(t, r.Keys[1], syscall.ESTALE, "store of key 11")
			assert.Equal(t, tier.StatusStored, r.Keys[2].Status, "%v", r.Keys[2].Err)
			assert.Positive(t, eio.Fired())
			assert.Positive(t, estale.Fired())
			// Nothing partial is visible: the failed blocks are absent, no temporary file is left.
			for i, want := range map[int]bool{10: false, 11: false, 12: true} {
				ok, err := tr.BlockStore().Has(tr.Namespace(), key(i))
				require.NoError(t, err)
				assert.Equal(t, want, ok, "block %d visible", i)
			}
			assert.Empty(t, tempFiles(t, tr.BlockStore(), tr.Namespace()))
		})
	})
}

// TestCorruptionOnDisk flips one payload byte of a stored block: the load reports StatusCorrupt
// (blockstore.ErrCorrupt, "checksum"), the file is moved to <root>/~quarantine, and the next
// lookup misses while a healthy block of the same request loads.
func TestCorruptionOnDisk(t *testing.T) {
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		root := t.TempDir()
		tr := openTier(t, kind, root, nil)
		require.NoError(t, tr.Store(1, keys(0, 1), [][]byte{payload(0, blockSize), payload(1, blockSize)}))
		for _, k := range await(t, tr, 1)[1].Keys {
			require.Equal(t, tier.StatusStored, k.Status, "%v", k.Err)
		}
		path := filepath.Join(root, blockRel(tr, 0))
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		b := []byte{0}
		_, err = f.ReadAt(b, blockstore.HeaderSize+1234)
		require.NoError(t, err)
		b[0] ^= 0x01
		_, err = f.WriteAt(b, blockstore.HeaderSize+1234)
		require.NoError(t, err)
		require.NoError(t, f.Close())

		bufs := buffers(2, blockSize)
		require.NoError(t, tr.Load(2, keys(0, 1), bufs))
		r := await(t, tr, 2)[2]
		require.Equal(t, tier.StatusCorrupt, r.Keys[0].Status, "%v", r.Keys[0].Err)
		require.ErrorIs(t, r.Keys[0].Err, blockstore.ErrCorrupt)
		require.Contains(t, r.Keys[0].Err.Error(), "checksum")
		require.Equal(t, tier.StatusLoaded, r.Keys[1].Status, "%v", r.Keys[1].Err)
		require.Equal(t, payload(1, blockSize), bufs[1])

		_, err = os.Stat(path)
		require.ErrorIs(t, err, fs.ErrNotExist, "the corrupt block is still in place")
		q, err := os.ReadDir(filepath.Join(root, "~quarantine"))
		require.NoError(t, err)
		require.Len(t, q, 1, "quarantine")
		require.Contains(t, q[0].Name(), fmt.Sprintf("%x", key(0)))

		require.NoError(t, tr.Lookup(3, keys(0, 1)))
		require.Equal(t, []tier.Status{tier.StatusMissing, tier.StatusFound}, statuses(await(t, tr, 3)[3]))
	})
}

// TestLoadsThroughFUSE: whole and truncated blocks of both formats, loaded through a FUSE mount into
// heap buffers and into the tier's aligned ones (O_DIRECT), are judged by their true length. An
// asynchronous READV through FUSE reports more than the file holds once it meets the file's end
// (12,288 bytes read of an 8,192-byte file, 7,992 of 3,996), so the io_uring engine reads header and
// payload with one READV only where it reads inline (local filesystems); with READV here, the whole
// block below is judged corrupt and the truncated one on a wrong size.
func TestLoadsThroughFUSE(t *testing.T) {
	needRoot(t, "FUSE")
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		for _, f := range []blockstore.Format{blockstore.FormatFramed, blockstore.FormatRaw} {
			for _, aligned := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/direct=%v", f, aligned), func(t *testing.T) {
					fsys := mountFaultFS(t)
					tr := openTier(t, kind, fsys.Mountpoint(), func(o *tier.Options) { o.Format, o.Buffers = f, 2 })
					require.NoError(t, tr.BlockStore().Put(tr.Namespace(), key(1), payload(1, blockSize)))
					require.NoError(t, tr.BlockStore().Put(tr.Namespace(), key(2), payload(2, blockSize)))
					p := filepath.Join(fsys.Mountpoint(), blockRel(tr, 2))
					st, err := os.Stat(p)
					require.NoError(t, err)
					require.NoError(t, os.Truncate(p, st.Size()-100))

					bufs := buffers(2, blockSize)
					if aligned {
						require.True(t, tr.Engine().Direct, "O_DIRECT through FUSE")
						bufs = tr.Buffers()
					}
					require.NoError(t, tr.Load(1, keys(1, 2), bufs))
					r := await(t, tr, 1)[1]
					require.Equal(t, tier.StatusLoaded, r.Keys[0].Status, "%v", r.Keys[0].Err)
					require.Equal(t, payload(1, blockSize), bufs[0])
					require.Equal(t, tier.StatusCorrupt, r.Keys[1].Status, "%v", r.Keys[1].Err)
					require.Contains(t, r.Keys[1].Err.Error(), fmt.Sprintf("file is %d bytes", st.Size()-100))
				})
			}
		}
	})
}

// TestShortBlocksThroughFUSE cuts block files of four pages short by part of a page and by whole
// pages, and loads them with O_DIRECT into the tier's buffers: every one is corrupt, its size said
// right, on both engines. The kernel (6.18), with go-fuse's server under faultfs, reports an
// asynchronous O_DIRECT read of a FUSE file that it shortened to the file's last page, and that the
// server then answered in full, as having read all it asked: before the io_uring engine read the
// block's last page apart (blockstore.Config.AsyncDirectReads), a raw block cut by a page loaded as
// whole, the missing page whatever the buffer held. A probe at Open finds the miscount
// (tier.EngineInfo.LastPageApart), and finds none when faultfs opens its files through the page
// cache (no FOPEN_DIRECT_IO), where the kernel counts right and loads need no read more.
func TestShortBlocksThroughFUSE(t *testing.T) {
	needRoot(t, "FUSE")
	const size = 4 * blockSize
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		for _, c := range []struct {
			f         blockstore.Format
			pageCache bool
		}{{blockstore.FormatFramed, false}, {blockstore.FormatRaw, false}, {blockstore.FormatRaw, true}} {
			f := c.f
			fsys := mountFaultFSWith(t, faultfs.Options{PageCache: c.pageCache})
			tr := openTier(t, kind, fsys.Mountpoint(), func(o *tier.Options) { o.Format, o.Buffers, o.BlockSize = f, 1, size })
			require.True(t, tr.Engine().Direct, "O_DIRECT through FUSE")
			require.Equal(t, kind == tier.EngineURing && !c.pageCache, tr.Engine().LastPageApart,
				"the probe at Open finds the miscount on go-fuse's server, with FOPEN_DIRECT_IO only (page cache %v)", c.pageCache)
			for i, cut := range []int64{100, blockSize, blockSize + 100, 2 * blockSize} {
				t.Run(fmt.Sprintf("%v/pagecache=%v/cut=%d", f, c.pageCache, cut), func(t *testing.T) {
					require.NoError(t, tr.BlockStore().Put(tr.Namespace(), key(i), payload(i, size)))
					p := filepath.Join(fsys.Mountpoint(), blockRel(tr, i))
					st, err := os.Stat(p)
					require.NoError(t, err)
					require.NoError(t, os.Truncate(p, st.Size()-cut))
					buf := tr.Buffers()[0]
					copy(buf, payload(i, size)) // what a misread would leave in place
					require.NoError(t, tr.Load(uint64(i+1), keys(i), [][]byte{buf}))
					r := await(t, tr, uint64(i+1))[uint64(i+1)]
					require.Equal(t, tier.StatusCorrupt, r.Keys[0].Status, "%v", r.Keys[0].Err)
					require.Contains(t, r.Keys[0].Err.Error(), fmt.Sprintf("file is %d bytes", st.Size()-cut))
				})
			}
		}
	})
}

// TestMkdirAllRacingClient makes a MKDIR fail with EEXIST while nothing is
// at its path, as on GlusterFS when another client has just made the
// directory and this one cannot see it yet: os.MkdirAll then fails with
// "file exists" (three processes opening one namespace at once failed
// TestEvictionAcrossProcesses/gluster so), blockstore.MkdirAll and a Put's
// own mkdirs try again and make it, and a name that stays taken still fails.
func TestMkdirAllRacingClient(t *testing.T) {
	fsys := mountFaultFS(t)
	mp := fsys.Mountpoint()
	once := func(path string) *faultfs.Rule {
		var n atomic.Int32
		r, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpMkdir, Path: path, Errno: syscall.EEXIST,
			Filter: func(faultfs.Op) bool { return n.Add(1) == 1 }})
		require.NoError(t, err)
		return r
	}

	r := once("a/b")
	err := os.MkdirAll(filepath.Join(mp, "a", "b"), 0o755)
	require.ErrorIs(t, err, fs.ErrExist, "os.MkdirAll under the fault")
	assert.EqualValues(t, 1, r.Fired())
	r.Remove()

	r = once("c/d")
	require.NoError(t, blockstore.MkdirAll(filepath.Join(mp, "c", "d")))
	assert.EqualValues(t, 1, r.Fired())
	assert.DirExists(t, filepath.Join(mp, "c", "d"))
	r.Remove()

	r, err = fsys.Inject(faultfs.Fault{Ops: faultfs.OpMkdir, Path: "e/f", Errno: syscall.EEXIST})
	require.NoError(t, err)
	require.ErrorIs(t, blockstore.MkdirAll(filepath.Join(mp, "e", "f")), fs.ErrExist, "a name that stays taken")
	assert.EqualValues(t, 10, r.Fired())
	r.Remove()

	require.NoError(t, os.WriteFile(filepath.Join(mp, "g"), nil, 0o644))
	require.ErrorIs(t, blockstore.MkdirAll(filepath.Join(mp, "g")), syscall.ENOTDIR, "a file in the way")

	// A Put into a namespace no one has made, as the first block stored
	// there by two clients at once: its mkdir of the namespace meets the
	// same race, twice (once in each of its passes over the directories).
	store, err := blockstore.Open(filepath.Join(mp, "root"), blockstore.Options{})
	require.NoError(t, err)
	var n atomic.Int32
	r, err = fsys.Inject(faultfs.Fault{Ops: faultfs.OpMkdir, Path: "root/ns", Errno: syscall.EEXIST,
		Filter: func(faultfs.Op) bool { return n.Add(1) <= 2 }})
	require.NoError(t, err)
	require.NoError(t, store.Put("ns", []byte("key-0001"), []byte("block")))
	assert.EqualValues(t, 2, r.Fired())
	got := make([]byte, 16)
	m, err := store.Get("ns", []byte("key-0001"), got)
	require.NoError(t, err)
	assert.Equal(t, []byte("block"), got[:m])
	r.Remove()

	r, err = fsys.Inject(faultfs.Fault{Ops: faultfs.OpMkdir, Path: "root/taken", Errno: syscall.EEXIST})
	require.NoError(t, err)
	require.ErrorIs(t, store.Put("taken", []byte("key-0001"), []byte("block")), fs.ErrExist, "a namespace's name that stays taken")
	assert.EqualValues(t, 10, r.Fired())
}
