package blockstore

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fill puts n blocks of size bytes into ns and returns their keys.
func fill(t *testing.T, s *Store, ns string, first, n, size int) [][]byte {
	t.Helper()
	var keys [][]byte
	for i := first; i < first+n; i++ {
		k := testKey(i, 32)
		require.NoError(t, s.Put(ns, k, testPayload(k, size)))
		keys = append(keys, k)
	}
	return keys
}

func TestScanAndUsage(t *testing.T) {
	s := openTestStore(t, Options{})
	a := fill(t, s, "a", 0, 20, 100)
	fill(t, s, "b", 100, 5, 1000)
	// Strays the scan must skip: a temp file, a foreign file, a quarantine.
	k := testKey(999, 32)
	require.NoError(t, s.EnsureDir("a", k))
	dir, _ := s.NamespaceDir("a")
	require.NoError(t, os.WriteFile(filepath.Join(dir, string(FanoutLayout{}.AppendTempPath(nil, k, 1))), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README"), []byte("x"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(s.Root(), quarantineName, "a"), 0o755))

	var got [][]byte
	require.NoError(t, s.Scan("a", func(b BlockInfo) error {
		assert.Equal(t, "a", b.Namespace)
		assert.Equal(t, int64(HeaderSize+100), b.Size)
		got = append(got, b.Key)
		return nil
	}))
	sortKeys(got)
	sortKeys(a)
	assert.Equal(t, a, got)

	n := 0
	stop := errors.New("stop")
	require.ErrorIs(t, s.Scan("", func(BlockInfo) error { n++; return stop }), stop)
	assert.Equal(t, 1, n)
	require.ErrorIs(t, s.Scan("../x", func(BlockInfo) error { return nil }), ErrInvalidNamespace)

	nss, err := s.Namespaces()
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, nss)

	u, err := s.Usage()
	require.NoError(t, err)
	assert.Equal(t, []NamespaceUsage{
		{Namespace: "a", Blocks: 20, Bytes: 20 * (HeaderSize + 100)},
		{Namespace: "b", Blocks: 5, Bytes: 5 * (HeaderSize + 1000)},
	}, u)
}

func sortKeys(keys [][]byte) {
	sort.Slice(keys, func(i, j int) bool { return string(keys[i]) < string(keys[j]) })
}

func TestVerify(t *testing.T) {
	for _, action := range []VerifyAction{VerifyReport, VerifyQuarantine, VerifyRemove} {
		s := openTestStore(t, Options{})
		keys := fill(t, s, "ns", 0, 10, 5000)
		info := func(k []byte) BlockInfo {
			b, err := s.Stat("ns", k)
			require.NoError(t, err)
			return b
		}
		flipByte(t, info(keys[1]).Path, HeaderSize+10)
		require.NoError(t, os.Truncate(info(keys[2]).Path, HeaderSize+4999))
		require.NoError(t, os.Rename(info(keys[3]).Path, info(keys[4]).Path)) // keys[4]'s path holds keys[3]

		var problems []Problem
		stats, err := s.Verify("", action, func(p Problem) { problems = append(problems, p) })
		require.NoError(t, err)
		assert.Equal(t, int64(9), stats.Blocks)
		assert.Equal(t, int64(3), stats.Corrupt)
		require.Len(t, problems, 3)
		for _, p := range problems {
			require.ErrorIs(t, p.Err, ErrCorrupt)
			require.NoError(t, p.ActionErr)
			switch action {
			case VerifyQuarantine:
				assert.FileExists(t, p.Moved)
				assert.NoFileExists(t, p.Block.Path)
			case VerifyRemove:
				assert.True(t, p.Removed)
				assert.NoFileExists(t, p.Block.Path)
			default:
				assert.FileExists(t, p.Block.Path)
			}
		}
		stats, err = s.Verify("ns", VerifyReport, nil)
		require.NoError(t, err)
		if action == VerifyReport {
			assert.Equal(t, int64(3), stats.Corrupt)
		} else {
			assert.Equal(t, VerifyStats{Blocks: 6, Bytes: 6 * (HeaderSize + 5000)}, stats)
		}
	}
}

func TestClean(t *testing.T) {
	s := openTestStore(t, Options{})
	keys := fill(t, s, "ns", 0, 3, 100)
	dir, err := s.NamespaceDir("ns")
	require.NoError(t, err)
	old := filepath.Join(dir, string(FanoutLayout{}.AppendTempPath(nil, keys[0], 1)))
	fresh := filepath.Join(dir, string(FanoutLayout{}.AppendTempPath(nil, keys[1], 2)))
	require.NoError(t, os.WriteFile(old, make([]byte, 10), 0o644))
	require.NoError(t, os.WriteFile(fresh, make([]byte, 20), 0o644))
	hourAgo := time.Now().Add(-time.Hour)
	require.NoError(t, os.Chtimes(old, hourAgo, hourAgo))

	stats, err := s.Clean(10 * time.Minute)
	require.NoError(t, err)
	assert.Equal(t, CleanStats{Removed: 1, Bytes: 10}, stats)
	assert.NoFileExists(t, old)
	assert.FileExists(t, fresh)

	stats, err = s.Clean(0)
	require.NoError(t, err)
	assert.Equal(t, CleanStats{Removed: 1, Bytes: 20}, stats)
	assert.Len(t, listFiles(t, s.Root()), 3, "blocks are untouched")
}

// TestVerifyKeepsAccessTime checks that Verify does not make blocks look
// recently used to an evictor.
func TestVerifyKeepsAccessTime(t *testing.T) {
	s := openTestStore(t, Options{})
	keys := fill(t, s, "ns", 0, 3, 100)
	old := time.Now().Add(-48 * time.Hour).Truncate(time.Second)
	for _, k := range keys {
		b, err := s.Stat("ns", k)
		require.NoError(t, err)
		require.NoError(t, os.Chtimes(b.Path, old, old))
	}
	_, err := s.Verify("ns", VerifyReport, nil)
	require.NoError(t, err)
	for _, k := range keys {
		b, err := s.Stat("ns", k)
		require.NoError(t, err)
		assert.True(t, b.AccessTime.Equal(old), "atime %v, want %v", b.AccessTime, old)
	}
}
