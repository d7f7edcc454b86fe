package tier

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
)

// Entries other than regular files at block paths, as a tenant sharing the
// directory could plant them: a load must judge them corrupt at once,
// without blocking and without following a link out of the tree.

// outsideBlock writes block i, as a valid block file of the same
// namespace, into a store outside the tier's tree, and returns its path.
func outsideBlock(t *testing.T, tr *Tier, i int) string {
	root := t.TempDir()
	s, err := blockstore.Open(root, blockstore.Options{})
	require.NoError(t, err)
	require.NoError(t, s.Put(tr.Namespace(), testKey(i), testPayload(i)))
	info, err := s.Stat(tr.Namespace(), testKey(i))
	require.NoError(t, err)
	return info.Path
}

// snapshot returns every entry under dir with its content (files) or
// target (links), to tell whether anything there changed.
func snapshot(t *testing.T, dir string) map[string]string {
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		switch {
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			out[p] = fmt.Sprintf("file %v %s", info.ModTime(), b)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			require.NoError(t, err)
			out[p] = "link " + target
		default:
			out[p] = info.Mode().String()
		}
		return nil
	}))
	return out
}

func TestNotRegularAtBlockPath(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, c := range []struct {
			name       string
			plant      func(t *testing.T, tr *Tier, path string) (target string)
			want       string
			quarantine bool // a link stays: moving it aside could mean following one
			lookup     Status
		}{
			{"fifo", func(t *testing.T, _ *Tier, path string) string {
				require.NoError(t, unix.Mkfifo(path, 0o644))
				return ""
			}, "not a regular file (fifo)", true, StatusFound},
			{"symlink", func(t *testing.T, tr *Tier, path string) string {
				target := outsideBlock(t, tr, 0)
				require.NoError(t, os.Symlink(target, path))
				return target
			}, "symlink at block path", false, StatusMissing},
			{"directory", func(t *testing.T, _ *Tier, path string) string {
				require.NoError(t, os.Mkdir(path, 0o755))
				return ""
			}, "not a regular file (directory)", true, StatusFound},
		} {
			t.Run(c.name, func(t *testing.T) {
				const deadline = 2 * time.Second
				tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.IOTimeout = deadline })
				path := blockFile(tr, 0)
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				target := c.plant(t, tr, path)
				var before map[string]string
				if target != "" {
					before = snapshot(t, filepath.Dir(target))
				}

				require.NoError(t, tr.Lookup(1, testKeys(0)))
				// A lookup does not judge what it finds: a symlink is no
				// block, anything else is for a load to judge.
				assert.Equal(t, []Status{c.lookup}, statuses(await(t, tr, 1)[1]))
				buf := make([]byte, testBlockSize)
				start := time.Now()
				require.NoError(t, tr.Load(2, testKeys(0), [][]byte{buf}))
				k := await(t, tr, 2)[2].Keys[0]
				assert.Less(t, time.Since(start), deadline/2, "the load waited")
				assert.Equal(t, StatusCorrupt, k.Status, "%v", k.Err)
				assert.ErrorIs(t, k.Err, blockstore.ErrCorrupt)
				if k.Err != nil {
					assert.Contains(t, k.Err.Error(), c.want)
				}
				_, err := os.Lstat(path)
				q, qerr := os.ReadDir(tr.qDir)
				require.NoError(t, qerr)
				if c.quarantine {
					assert.ErrorIs(t, err, fs.ErrNotExist, "quarantined")
					assert.Len(t, q, 1)
				} else {
					assert.NoError(t, err, "left in place")
					assert.Empty(t, q)
				}
				if target != "" {
					assert.Equal(t, before, snapshot(t, filepath.Dir(target)), "the link's target changed")
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				assert.NoError(t, tr.Close(ctx))
			})
		}
	})
}

// TestSymlinkedFanoutDir replaces a top-level fan-out directory with a
// link to another tree's, holding a valid block: loads do not read it,
// stores write nothing there, and a delete of the block does not remove
// the other tree's (it once did: UNLINKAT follows links on the way).
func TestSymlinkedFanoutDir(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), nil)
		target := outsideBlock(t, tr, 0)
		outsideTop := filepath.Dir(filepath.Dir(target))
		require.NoError(t, os.Symlink(outsideTop, fanoutTop(tr, 0)))
		before := snapshot(t, outsideTop)

		buf := make([]byte, testBlockSize)
		require.NoError(t, tr.Load(1, testKeys(0), [][]byte{buf}))
		k := await(t, tr, 1)[1].Keys[0]
		assert.Equal(t, StatusCorrupt, k.Status, "%v", k.Err)
		assert.ErrorIs(t, k.Err, blockstore.ErrCorrupt)
		assert.False(t, bytes.Equal(testPayload(0), buf), "read through the link")

		other := sameTopOtherLeaf(t, 0)
		require.NoError(t, tr.Store(2, testKeys(0, other), [][]byte{testPayload(0), testPayload(other)}))
		for j, k := range await(t, tr, 2)[2].Keys {
			assert.Equal(t, StatusFailed, k.Status, "store %d: %v", j, k.Err)
		}
		require.NoError(t, tr.Delete(3, testKeys(0)))
		k = await(t, tr, 3)[3].Keys[0]
		assert.Equal(t, StatusMissing, k.Status, "delete: %v", k.Err)
		assert.FileExists(t, target)
		assert.Equal(t, before, snapshot(t, outsideTop), "something changed through the link")
	})
}

// TestFileInPlaceOfFanoutDir plants a regular file where block 0's leaf
// fan-out directory belongs: a lookup, a load and a store of the block
// fail with ENOTDIR, with both lookup operations, and the file is left as
// it was. The O_PATH lookup's open has O_DIRECTORY, which makes a block
// that is there ENOTDIR too (found); it tells the two apart because its
// RESOLVE_CACHED walk cannot go past a file in place of a directory
// (EAGAIN) and STATX asks again.
func TestFileInPlaceOfFanoutDir(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, op := range []LookupOp{LookupOpenPath, LookupStatx} {
			if kind == EngineSync && op != LookupOpenPath {
				continue // the sync engine has one way
			}
			t.Run(op.String(), func(t *testing.T) {
				tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Lookup = op })
				leaf := filepath.Dir(blockFile(tr, 0))
				require.NoError(t, os.MkdirAll(filepath.Dir(leaf), 0o755))
				require.NoError(t, os.WriteFile(leaf, []byte("not a directory"), 0o644))

				require.NoError(t, tr.Lookup(1, testKeys(0)))
				k := await(t, tr, 1)[1].Keys[0]
				assert.Equal(t, StatusFailed, k.Status, "lookup: %v", k.Err)
				assert.ErrorIs(t, k.Err, unix.ENOTDIR, "lookup")
				buf := make([]byte, testBlockSize)
				require.NoError(t, tr.Load(2, testKeys(0), [][]byte{buf}))
				require.NoError(t, tr.Store(3, testKeys(1, 0), [][]byte{testPayload(1), testPayload(0)}))
				got := await(t, tr, 2, 3)
				k = got[2].Keys[0]
				assert.Equal(t, StatusFailed, k.Status, "load: %v", k.Err)
				assert.ErrorIs(t, k.Err, unix.ENOTDIR, "load")
				res := got[3]
				assert.Equal(t, StatusStored, res.Keys[0].Status, "another leaf's store: %v", res.Keys[0].Err)
				assert.Equal(t, StatusFailed, res.Keys[1].Status, "store: %v", res.Keys[1].Err)
				assert.ErrorIs(t, res.Keys[1].Err, unix.ENOTDIR, "store")
				b, err := os.ReadFile(leaf)
				require.NoError(t, err)
				assert.Equal(t, "not a directory", string(b))
			})
		}
	})
}
