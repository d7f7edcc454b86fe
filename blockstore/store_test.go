package blockstore

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func openTestStore(t *testing.T, opts Options) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), opts)
	require.NoError(t, err)
	return s
}

// listFiles returns every regular file under dir, relative to it.
func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

func TestOpenOptions(t *testing.T) {
	_, err := Open(t.TempDir(), Options{Durability: DurabilityFull + 1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = Open("", Options{})
	require.ErrorIs(t, err, ErrInvalidOptions)
	s, err := Open(filepath.Join(t.TempDir(), "a", "b"), Options{})
	require.NoError(t, err)
	assert.Equal(t, DurabilityNone, s.Durability())
	assert.Equal(t, FanoutLayout{}, s.Layout())
	assert.Equal(t, "none", DurabilityNone.String())
	assert.Equal(t, "full", DurabilityFull.String())
}

func TestRoundTrip(t *testing.T) {
	for _, d := range []Durability{DurabilityNone, DurabilityData, DurabilityFull} {
		s := openTestStore(t, Options{Durability: d})
		for i, n := range []int{0, 1, 7, 4095, 4096, 4097, 2 << 20, 64 << 20} {
			if n == 64<<20 && d != DurabilityNone {
				continue // one 64 MiB round trip is enough
			}
			t.Run(fmt.Sprintf("durability=%v/size=%d", d, n), func(t *testing.T) {
				key := testKey(i, 8+i*7)
				payload := testPayload(key, n)
				require.NoError(t, s.Put("ns", key, payload))

				buf := make([]byte, n+10)
				got, err := s.Get("ns", key, buf)
				require.NoError(t, err)
				require.Equal(t, n, got)
				require.True(t, string(payload) == string(buf[:got]), "payload differs")

				ok, err := s.Has("ns", key)
				require.NoError(t, err)
				assert.True(t, ok)
				info, err := s.Stat("ns", key)
				require.NoError(t, err)
				assert.Equal(t, int64(HeaderSize+n), info.Size)
				assert.Equal(t, key, info.Key)
				assert.Equal(t, "ns", info.Namespace)
				assert.False(t, info.ModTime.IsZero())

				fi, err := os.Stat(info.Path)
				require.NoError(t, err)
				assert.Equal(t, int64(HeaderSize+n), fi.Size(), "file size is exact")
			})
		}
		// Only block files remain: no temporary files.
		for _, f := range listFiles(t, s.Root()) {
			assert.True(t, strings.HasSuffix(f, ".blk"), f)
		}
	}
}

func TestMissingAndInvalid(t *testing.T) {
	s := openTestStore(t, Options{})
	key := testKey(1, 16)

	_, err := s.Get("ns", key, make([]byte, 10))
	require.ErrorIs(t, err, fs.ErrNotExist)
	ok, err := s.Has("ns", key)
	require.NoError(t, err)
	assert.False(t, ok)
	_, err = s.Stat("ns", key)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorIs(t, s.Delete("ns", key), fs.ErrNotExist)

	require.ErrorIs(t, s.Put("ns", key[:7], nil), ErrInvalidKey)
	require.ErrorIs(t, s.Put("../x", key, nil), ErrInvalidNamespace)
	_, err = s.Get("a/b", key, nil)
	require.ErrorIs(t, err, ErrInvalidNamespace)
	_, err = s.Has("ns", make([]byte, 65))
	require.ErrorIs(t, err, ErrInvalidKey)
	_, err = s.NamespaceDir("..")
	require.ErrorIs(t, err, ErrInvalidNamespace)
	require.ErrorIs(t, s.EnsureDir("ns", nil), ErrInvalidKey)

	require.NoError(t, s.Put("ns", key, testPayload(key, 100)))
	_, err = s.Get("ns", key, make([]byte, 99))
	require.ErrorIs(t, err, ErrBufferSize)
	assert.Contains(t, err.Error(), "buffer is 99 bytes, payload is 100")

	require.NoError(t, s.Delete("ns", key))
	ok, err = s.Has("ns", key)
	require.NoError(t, err)
	assert.False(t, ok)
}

// TestCorruptFiles damages block files on disk and checks that Get reports
// ErrCorrupt saying what was wrong.
func TestCorruptFiles(t *testing.T) {
	s := openTestStore(t, Options{})
	key, other := testKey(1, 32), testKey(2, 32)
	payload := testPayload(key, 10000)
	path := func(k []byte) string {
		info, err := s.Stat("ns", k)
		require.NoError(t, err)
		return info.Path
	}
	reset := func() {
		require.NoError(t, s.Put("ns", key, payload))
		require.NoError(t, s.Put("ns", other, testPayload(other, 10000)))
	}
	cases := []struct {
		name   string
		damage func(p string)
		want   string
	}{
		{"truncated", func(p string) { require.NoError(t, os.Truncate(p, HeaderSize+9999)) }, "file is 14095 bytes"},
		{"extended", func(p string) { require.NoError(t, os.Truncate(p, HeaderSize+10001)) }, "file is 14097 bytes"},
		{"header-only", func(p string) { require.NoError(t, os.Truncate(p, 100)) }, "file is 100 bytes, shorter than the 4096-byte header"},
		{"empty", func(p string) { require.NoError(t, os.Truncate(p, 0)) }, "file is 0 bytes, shorter than the 4096-byte header"},
		{"payload-byte", func(p string) { flipByte(t, p, HeaderSize+5000) }, "payload checksum"},
		{"last-byte", func(p string) { flipByte(t, p, HeaderSize+9999) }, "payload checksum"},
		{"header-byte", func(p string) { flipByte(t, p, offPayloadSize) }, "header checksum"},
		{"renamed", func(p string) { require.NoError(t, os.Rename(path(other), p)) }, "key is"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reset()
			c.damage(path(key))
			_, err := s.Get("ns", key, make([]byte, 20000))
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func flipByte(t *testing.T, path string, off int64) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	var b [1]byte
	_, err = f.ReadAt(b[:], off)
	require.NoError(t, err)
	b[0] ^= 0x10
	_, err = f.WriteAt(b[:], off)
	require.NoError(t, err)
}

// TestPutFailureLeavesNothing injects ENOSPC into each write of a Put (one
// of header and payload; with writes of at most RWMax = 256 KiB, the header
// alone, then the payload in four) and checks that the error reaches the
// caller and no file remains.
func TestPutFailureLeavesNothing(t *testing.T) {
	key := testKey(1, 32)
	old := RWMax
	t.Cleanup(func() { RWMax = old })
	for _, tc := range []struct{ rwMax, writes int }{{old, 1}, {256 << 10, 5}} {
		RWMax = tc.rwMax
		for failAt := range tc.writes {
			t.Run(fmt.Sprintf("rwmax=%d/write=%d", tc.rwMax, failAt), func(t *testing.T) {
				s := openTestStore(t, Options{Durability: DurabilityData})
				writes, injected := 0, 0
				s.hooks = &testHooks{write: func() error {
					writes++
					if writes-1 == failAt {
						injected++
						return unix.ENOSPC
					}
					return nil
				}}
				err := s.Put("ns", key, testPayload(key, 1<<20))
				require.ErrorIs(t, err, unix.ENOSPC)
				assert.Equal(t, 1, injected, "fault fired")
				assert.Empty(t, listFiles(t, s.Root()))
				ok, err := s.Has("ns", key)
				require.NoError(t, err)
				assert.False(t, ok)

				writes = 0
				s.hooks.write = func() error { writes++; return nil }
				require.NoError(t, s.Put("ns", key, testPayload(key, 1<<20)))
				assert.Equal(t, tc.writes, writes, "writes of a whole Put")
			})
		}
	}
}

// TestDirectoryVanishes removes a cached fan-out directory: Put recreates
// it and retries.
func TestDirectoryVanishes(t *testing.T) {
	s := openTestStore(t, Options{})
	key := testKey(1, 32)
	require.NoError(t, s.Put("ns", key, []byte("one")))
	require.NoError(t, os.RemoveAll(filepath.Join(s.Root(), "ns")))
	require.NoError(t, s.Put("ns", key, []byte("two")))
	buf := make([]byte, 3)
	_, err := s.Get("ns", key, buf)
	require.NoError(t, err)
	assert.Equal(t, "two", string(buf))

	dir, err := s.NamespaceDir("other")
	require.NoError(t, err)
	assert.DirExists(t, dir)
	assert.Equal(t, filepath.Join(s.Root(), "other"), dir)
}

// TestDirectoryIsAFile puts a regular file where the namespace or a
// fan-out directory belongs: NamespaceDir, EnsureDir and Put fail with
// ENOTDIR naming that file (mkdir's EEXIST alone does not say a directory
// is there), and work once it is gone. A symlink to a directory is a
// directory, as it is for O_DIRECTORY.
func TestDirectoryIsAFile(t *testing.T) {
	key := testKey(1, 32)
	fanout := string(FanoutLayout{}.AppendDir(nil, key)) // "aa/bb"
	for _, c := range []struct {
		name  string
		where string // relative to the root
		link  bool   // a symlink to a directory rather than a file
	}{
		{"namespace", "ns", false},
		{"upper fan-out", "ns/" + fanout[:2], false},
		{"lower fan-out", "ns/" + fanout, false},
		{"namespace symlink", "ns", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openTestStore(t, Options{})
			obstacle := filepath.Join(s.Root(), c.where)
			require.NoError(t, os.MkdirAll(filepath.Dir(obstacle), 0o755))
			if c.link {
				target := t.TempDir()
				require.NoError(t, os.Symlink(target, obstacle))
				require.NoError(t, s.Put("ns", key, []byte("x")))
				assert.FileExists(t, filepath.Join(target, fanout, string(FanoutLayout{}.AppendPath(nil, key)[len(fanout)+1:])))
				return
			}
			require.NoError(t, os.WriteFile(obstacle, nil, 0o644))
			checks := map[string]func() error{
				"EnsureDir": func() error { return s.EnsureDir("ns", key) },
				"Put":       func() error { return s.Put("ns", key, []byte("x")) },
			}
			if c.where == "ns" {
				checks["NamespaceDir"] = func() error { _, err := s.NamespaceDir("ns"); return err }
			}
			for name, f := range checks {
				err := f()
				require.ErrorIs(t, err, unix.ENOTDIR, name)
				var pe *fs.PathError
				require.ErrorAs(t, err, &pe, name)
				assert.Equal(t, obstacle, pe.Path, "%s: %v", name, err)
			}
			require.NoError(t, os.Remove(obstacle))
			require.NoError(t, s.Put("ns", key, []byte("x")), "the directories are made once the file is gone")
		})
	}
}

func TestEnsureDirNoAllocs(t *testing.T) {
	s := openTestStore(t, Options{})
	key := testKey(1, 32)
	require.NoError(t, s.EnsureDir("ns", key))
	assert.DirExists(t, filepath.Join(s.Root(), "ns", string(FanoutLayout{}.AppendDir(nil, key))))
	allocs := testing.AllocsPerRun(100, func() {
		if err := s.EnsureDir("ns", key); err != nil {
			panic(err)
		}
	})
	assert.Zero(t, allocs)
}

// TestPutENOSPC fills a real 1 MiB tmpfs: the kernel's ENOSPC reaches the
// caller and no file is left. It needs CAP_SYS_ADMIN to mount.
func TestPutENOSPC(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount tmpfs (needs CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { require.NoError(t, unix.Unmount(dir, unix.MNT_DETACH)) })
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	key := testKey(1, 32)
	err = s.Put("ns", key, testPayload(key, 2<<20))
	require.ErrorIs(t, err, unix.ENOSPC)
	assert.Empty(t, listFiles(t, dir))
	require.NoError(t, s.Put("ns", key, testPayload(key, 100<<10)), "space was given back")
}
