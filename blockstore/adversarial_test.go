package blockstore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

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

// TestOpenBeneathWithoutOpenat2 runs Put and Get on the openat(2) fallback
// for kernels without openat2(2): they work, and a symlink as the last
// component is still refused.
func TestOpenBeneathWithoutOpenat2(t *testing.T) {
	noOpenat2.Store(true)
	t.Cleanup(func() { noOpenat2.Store(false) })
	s := openTestStore(t, Options{Durability: DurabilityFull})
	key := testKey(0, 32)
	require.NoError(t, s.Put("ns", key, []byte("one")))
	buf := make([]byte, 3)
	_, err := s.Get("ns", key, buf)
	require.NoError(t, err)
	assert.Equal(t, "one", string(buf))

	dir, err := s.NamespaceDir("ns")
	require.NoError(t, err)
	require.NoError(t, os.Symlink(filepath.Join(dir, "target"), filepath.Join(dir, "link")))
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	_, err = OpenBeneath(fd, []byte("link\x00"), unix.O_WRONLY|unix.O_CREAT, 0o644)
	assert.Equal(t, unix.ELOOP, err)
	assert.NoFileExists(t, filepath.Join(dir, "target"))
}
