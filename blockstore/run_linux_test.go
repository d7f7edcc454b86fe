package blockstore

import (
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestRunSyncWritesAllocates: RunSyncWrites hands a store's write to
// another executor (here one that calls pwritev itself), and, for an
// O_DIRECT store, allocates the file's blocks to the write's end before
// it, so that the write lands within the file's size over allocated
// blocks; a store through the page cache allocates nothing. Both stores
// publish the block whole.
func TestRunSyncWritesAllocates(t *testing.T) {
	for _, direct := range []bool{false, true} {
		dir := t.TempDir()
		require.NoError(t, unix.Mkdir(filepath.Join(dir, "ns"), 0o755))
		ns, err := unix.Open(filepath.Join(dir, "ns"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Close(ns) })

		key := testKey(7, 32)
		payload, hdr := alignedTestBytes(4*HeaderSize), alignedTestBytes(HeaderSize)
		copy(payload, testPayload(key, len(payload)))
		var p Program
		require.NoError(t, p.Start(testConfig(DurabilityNone), OpStore, key, payload, hdr, direct))
		writes := 0
		write := func(fd int, s *Step) int32 {
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(fd, &st))
			want := s.Off + s.Asked()
			if direct {
				assert.Equal(t, want, st.Size, "the file's size before its write")
				assert.GreaterOrEqual(t, st.Blocks*512, want, "blocks allocated before the write")
			} else {
				assert.Zero(t, st.Size, "a page-cache store allocated")
			}
			writes++
			r, _, errno := unix.Syscall6(unix.SYS_PWRITEV, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(s.Vec))), uintptr(len(s.Vec)), uintptr(s.Off), 0, 0)
			if errno != 0 {
				return -int32(errno)
			}
			return int32(r)
		}
		for range 10 {
			p.RunSyncWrites(ns, write)
			if p.Judge() {
				break
			}
		}
		require.Equal(t, StatusStored, p.Status, "direct %v: %v", direct, p.Err)
		assert.Equal(t, 1, writes, "direct %v: the store's one write through write", direct)

		s, err := Open(dir, Options{})
		require.NoError(t, err)
		got := make([]byte, len(payload))
		_, err = s.Get("ns", key, got)
		require.NoError(t, err, "direct %v", direct)
		assert.Equal(t, payload, got, "direct %v", direct)
	}
}

// alignedTestBytes returns n bytes at a HeaderSize boundary, for O_DIRECT.
func alignedTestBytes(n int) []byte {
	b := make([]byte, n+HeaderSize)
	off := -int(uintptr(unsafe.Pointer(&b[0]))) & (HeaderSize - 1)
	return b[off : off+n : off+n]
}
