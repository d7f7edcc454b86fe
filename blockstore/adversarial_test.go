package blockstore

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// keySharingTop returns a key whose top-level fan-out directory is key's
// and whose leaf directory is not.
func keySharingTop(t *testing.T, key []byte) []byte {
	for i := 1; i < 100_000; i++ {
		if k := testKey(i, len(key)); k[0] == key[0] && k[1] != key[1] {
			return k
		}
	}
	require.FailNow(t, "no key shares the top-level fan-out directory", "%x", key[:1])
	return nil
}

// TestPutAfterDirectoriesRemoved removes directories the Store remembers,
// up to its root, and stores into a directory it has never seen under the
// removed one: Put recreates every missing level.
func TestPutAfterDirectoriesRemoved(t *testing.T) {
	key := testKey(0, 32)
	other := keySharingTop(t, key)
	for _, c := range []struct {
		name   string
		victim func(s *Store) string
	}{
		{"fanout", func(s *Store) string { return filepath.Join(s.Root(), "ns", fmt.Sprintf("%02x", key[0])) }},
		{"namespace", func(s *Store) string { return filepath.Join(s.Root(), "ns") }},
		{"root", func(s *Store) string { return s.Root() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openTestStore(t, Options{Durability: DurabilityFull})
			require.NoError(t, s.Put("ns", key, []byte("one")))
			require.NoError(t, os.RemoveAll(c.victim(s)))

			require.NoError(t, s.Put("ns", other, []byte("two")))
			require.NoError(t, s.Put("ns", key, []byte("three")))
			for k, want := range map[string]string{string(other): "two", string(key): "three"} {
				buf := make([]byte, len(want))
				_, err := s.Get("ns", []byte(k), buf)
				require.NoError(t, err)
				assert.Equal(t, want, string(buf))
			}
		})
	}
}

// TestPutSymlinkedFanout plants a symlink to a directory outside the tree
// in place of a fan-out directory, one the Store has never seen and one it
// remembers: Put fails and writes nothing through the link.
func TestPutSymlinkedFanout(t *testing.T) {
	key := testKey(0, 32)
	top := fmt.Sprintf("%02x", key[0])
	leaf := filepath.Join(top, fmt.Sprintf("%02x", key[1]))
	for _, c := range []struct {
		name  string
		known bool   // Put once before planting the link
		link  string // the fan-out directory replaced by a link
	}{
		{"top-new", false, top},
		{"top-known", true, top},
		{"leaf-new", false, leaf},
		{"leaf-known", true, leaf},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openTestStore(t, Options{})
			nsDir, err := s.NamespaceDir("ns")
			require.NoError(t, err)
			if c.known {
				require.NoError(t, s.Put("ns", key, []byte("mine")))
			}
			outside := t.TempDir()
			link := filepath.Join(nsDir, c.link)
			require.NoError(t, os.RemoveAll(link))
			require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
			require.NoError(t, os.Symlink(outside, link))

			err = s.Put("ns", key, []byte("must not land outside"))
			require.Error(t, err)
			entries, err := os.ReadDir(outside)
			require.NoError(t, err)
			assert.Empty(t, entries, "Put wrote through the symlink")
		})
	}
}

// TestWithoutOpenat2 runs Put and Get on the openat(2) fallback for
// kernels without openat2(2): they work, and a symlink as the last
// component is still refused.
func TestWithoutOpenat2(t *testing.T) {
	noOpenat2.Store(true)
	t.Cleanup(func() { noOpenat2.Store(false) })
	s := openTestStore(t, Options{Durability: DurabilityFull})
	key := testKey(0, 32)
	require.NoError(t, s.Put("ns", key, []byte("one")))
	buf := make([]byte, 3)
	_, err := s.Get("ns", key, buf)
	require.NoError(t, err)
	assert.Equal(t, "one", string(buf))

	info, err := s.Stat("ns", key)
	require.NoError(t, err)
	require.NoError(t, os.Rename(info.Path, info.Path+".target"))
	require.NoError(t, os.Symlink(info.Path+".target", info.Path))
	_, err = s.Get("ns", key, buf)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "symlink at block path")
}

// notRegular are entries that are not block files, planted at a block
// path: each returns what it planted and the path of a file outside the
// tree that it links to, if any.
var notRegular = []struct {
	name  string
	plant func(t *testing.T, s *Store, key []byte, path string) (outside string)
	want  string
}{
	{"fifo", func(t *testing.T, _ *Store, _ []byte, path string) string {
		require.NoError(t, unix.Mkfifo(path, 0o644))
		return ""
	}, "not a regular file (fifo)"},
	{"symlink", func(t *testing.T, _ *Store, key []byte, path string) string {
		outside := outsideBlock(t, key)
		require.NoError(t, os.Symlink(outside, path))
		return outside
	}, "symlink at block path"},
	{"directory", func(t *testing.T, _ *Store, _ []byte, path string) string {
		require.NoError(t, os.Mkdir(path, 0o755))
		return ""
	}, "not a regular file (directory)"},
	{"symlinked-fanout", func(t *testing.T, s *Store, key []byte, path string) string {
		outside := outsideBlock(t, key)
		top := filepath.Dir(filepath.Dir(path))
		require.NoError(t, os.RemoveAll(top))
		require.NoError(t, os.Symlink(filepath.Dir(filepath.Dir(outside)), top))
		return outside
	}, "symlink at block path"},
}

// outsideBlock writes a valid block of key into a store outside the tree
// under test and returns its path.
func outsideBlock(t *testing.T, key []byte) string {
	s := openTestStore(t, Options{})
	require.NoError(t, s.Put("ns", key, testPayload(key, 100)))
	info, err := s.Stat("ns", key)
	require.NoError(t, err)
	return info.Path
}

// withinSeconds runs f and fails t if it has not returned within two
// seconds (a read blocked on a FIFO, say).
func withinSeconds(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		require.FailNow(t, what+" blocked")
	}
}

// unchanged fails t if the file at path no longer holds want.
func unchanged(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, want, got, "the file outside the tree changed")
}

// TestGetNotRegular plants entries that are not block files at a block
// path: Get reports ErrCorrupt saying what it found, at once, and reads
// nothing through a link.
func TestGetNotRegular(t *testing.T) {
	key := testKey(0, 32)
	for _, c := range notRegular {
		t.Run(c.name, func(t *testing.T) {
			s := openTestStore(t, Options{})
			require.NoError(t, s.Put("ns", key, testPayload(key, 50)))
			info, err := s.Stat("ns", key)
			require.NoError(t, err)
			require.NoError(t, os.Remove(info.Path))
			outside := c.plant(t, s, key, info.Path)
			var before []byte
			if outside != "" {
				before, err = os.ReadFile(outside)
				require.NoError(t, err)
			}

			withinSeconds(t, "Get", func() { _, err = s.Get("ns", key, make([]byte, 100)) })
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), c.want)
			if outside != "" {
				unchanged(t, outside, before)
			}
		})
	}
}

// TestVerifyNotRegular swaps block files for entries that are not block
// files just before Verify reads them (as a tenant could between its walk
// and its read): Verify reports each corrupt at once and quarantines the
// entry itself, never what a link points to.
func TestVerifyNotRegular(t *testing.T) {
	key := testKey(0, 32)
	for _, c := range notRegular[:3] { // a fan-out link is never walked into
		t.Run(c.name, func(t *testing.T) {
			s := openTestStore(t, Options{})
			require.NoError(t, s.Put("ns", key, testPayload(key, 50)))
			var outside string
			var before []byte
			s.hooks = &testHooks{beforeRead: func(path string) {
				require.NoError(t, os.Remove(path))
				outside = c.plant(t, s, key, path)
				if outside != "" {
					var err error
					before, err = os.ReadFile(outside)
					require.NoError(t, err)
				}
			}}
			var problems []Problem
			var stats VerifyStats
			var err error
			withinSeconds(t, "Verify", func() {
				stats, err = s.Verify("ns", VerifyQuarantine, func(p Problem) { problems = append(problems, p) })
			})
			require.NoError(t, err)
			assert.Equal(t, int64(1), stats.Corrupt)
			require.Len(t, problems, 1)
			require.ErrorIs(t, problems[0].Err, ErrCorrupt)
			assert.Contains(t, problems[0].Err.Error(), c.want)
			require.NoError(t, problems[0].ActionErr)
			assert.NotEmpty(t, problems[0].Moved, "not quarantined")
			_, err = os.Lstat(problems[0].Block.Path)
			assert.ErrorIs(t, err, fs.ErrNotExist)
			if outside != "" {
				unchanged(t, outside, before)
			}
		})
	}
}

// TestDeleteSymlinkedFanout plants a symlink to another tree in place of a
// fan-out directory, the other tree holding a file at the block's path
// beneath it: Delete reports the block missing and removes nothing there
// (it once unlinked the other tree's file through the link).
func TestDeleteSymlinkedFanout(t *testing.T) {
	key := testKey(0, 32)
	top := fmt.Sprintf("%02x", key[0])
	leaf := filepath.Join(top, fmt.Sprintf("%02x", key[1]))
	for _, link := range []string{top, leaf} {
		t.Run(link, func(t *testing.T) {
			s := openTestStore(t, Options{})
			nsDir, err := s.NamespaceDir("ns")
			require.NoError(t, err)
			require.NoError(t, s.Put("ns", key, []byte("mine")))
			outside := t.TempDir()
			rel, err := filepath.Rel(filepath.Join(nsDir, link), filepath.Join(nsDir, string(FanoutLayout{}.AppendPath(nil, key))))
			require.NoError(t, err)
			victim := filepath.Join(outside, rel)
			require.NoError(t, os.MkdirAll(filepath.Dir(victim), 0o755))
			require.NoError(t, os.WriteFile(victim, []byte("someone else's"), 0o644))
			require.NoError(t, os.RemoveAll(filepath.Join(nsDir, link)))
			require.NoError(t, os.Symlink(outside, filepath.Join(nsDir, link)))

			require.ErrorIs(t, s.Delete("ns", key), fs.ErrNotExist)
			b, err := os.ReadFile(victim)
			require.NoError(t, err, "Delete removed a file through the link")
			assert.Equal(t, "someone else's", string(b))
		})
	}
}

// TestVerifyFanoutSwapped replaces a fan-out directory with a link to
// another tree just before Verify reads a block beneath it (as a tenant
// could after the walk): the other tree's file at the block's path is
// neither read nor removed nor quarantined, since Verify opens the block's
// directory without following links (the block counts as gone). It once
// read the other tree's file by its path, found it corrupt and acted on it.
func TestVerifyFanoutSwapped(t *testing.T) {
	key := testKey(0, 32)
	top := fmt.Sprintf("%02x", key[0])
	for name, action := range map[string]VerifyAction{"remove": VerifyRemove, "quarantine": VerifyQuarantine} {
		t.Run(name, func(t *testing.T) {
			s := openTestStore(t, Options{})
			require.NoError(t, s.Put("ns", key, testPayload(key, 50)))
			nsDir, err := s.NamespaceDir("ns")
			require.NoError(t, err)
			outside := t.TempDir()
			var victim string
			s.hooks = &testHooks{beforeRead: func(path string) {
				rel, err := filepath.Rel(filepath.Join(nsDir, top), path)
				require.NoError(t, err)
				victim = filepath.Join(outside, rel)
				require.NoError(t, os.MkdirAll(filepath.Dir(victim), 0o755))
				require.NoError(t, os.WriteFile(victim, []byte("someone else's"), 0o644))
				require.NoError(t, os.Rename(filepath.Join(nsDir, top), filepath.Join(nsDir, "moved")))
				require.NoError(t, os.Symlink(outside, filepath.Join(nsDir, top)))
			}}
			var problems []Problem
			stats, err := s.Verify("ns", action, func(p Problem) { problems = append(problems, p) })
			require.NoError(t, err)
			require.NotEmpty(t, victim, "the swap was not made")
			assert.Empty(t, problems, "read through the link")
			assert.Zero(t, stats.Blocks)
			b, err := os.ReadFile(victim)
			require.NoError(t, err, "Verify removed or moved a file through the link")
			assert.Equal(t, "someone else's", string(b))
		})
	}
}
