package linux_test

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/tier"
)

// directBlockSize is the O_DIRECT tests' block: a multiple of 4 KiB, as O_DIRECT needs.
const directBlockSize = 16 << 10

// TestDirectIO runs the O_DIRECT probe, stores and loads on real filesystems, for each engine:
//   - XFS with 512-byte and with 4 KiB sectors (on loop devices of those logical block sizes) and
//     ext4 mounted noatime: the probe passes (EngineInfo.Direct), stores and loads of the tier's
//     aligned buffers are byte-exact and leave no page in the page cache, and buffers aligned to
//     512 bytes but not to 4 KiB go through the page cache, byte-exact too; on 4 KiB sectors a
//     512-byte O_DIRECT write is refused with EINVAL (blocks are multiples of 4 KiB);
//   - tmpfs: the probe passes, since Linux 6.6 ("tmpfs: trivial support for direct IO"), though the
//     pages stay in memory, as every tmpfs page does;
//   - ramfs, which refuses O_DIRECT at open with EINVAL: Direct is false, NoDirect gives the reason,
//     and stores and loads work through the page cache;
//   - a GlusterFS client mount (FUSE), which takes O_DIRECT and passes it to the server.
func TestDirectIO(t *testing.T) {
	needRoot(t, "mounting filesystems")
	cases := []struct {
		name     string
		mount    func(t *testing.T) string
		fs       string // EngineInfo.FS
		direct   bool   // EngineInfo.Direct
		uncached bool   // direct IO leaves nothing in the page cache
		sector   int    // the device's logical sector size, where there is a device
	}{
		{"xfs-sector=512", func(t *testing.T) string { return mountXFS(t, 512) }, "xfs", true, true, 512},
		{"xfs-sector=4096", func(t *testing.T) string { return mountXFS(t, 4096) }, "xfs", true, true, 4096},
		{"ext4-noatime", mountExt4, "ext4", true, true, 512},
		{"tmpfs", func(t *testing.T) string { return mountTmpfs(t, 64<<20) }, "tmpfs", true, false, 0},
		{"ramfs", mountRamfs, "0x858458f6" /* RAMFS_MAGIC */, false, false, 0},
		{"glusterfs", func(t *testing.T) string { return newGluster(t, 1, glusterCacheOff).Mounts[0] }, "fuse", true, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := c.mount(t)
			if c.sector > 0 {
				// O_DIRECT offsets and lengths must be multiples of the device's logical sector
				// size (a buffer's address only of its DMA alignment, 512 bytes here, since Linux
				// 6.0): 512-byte writes are refused on 4 KiB sectors. Blocks, headers and the
				// probe are multiples of 4 KiB, so both work.
				err := directWrite(dir, 512)
				if c.sector == 4096 {
					require.ErrorIs(t, err, unix.EINVAL, "a 512-byte O_DIRECT write on %d-byte sectors", c.sector)
				} else {
					require.NoError(t, err, "a 512-byte O_DIRECT write on %d-byte sectors", c.sector)
				}
			}
			engines(t, func(t *testing.T, kind tier.EngineKind) {
				ns := "direct-" + kind.String()
				tr := openTier(t, kind, dir, func(o *tier.Options) {
					o.Namespace, o.BlockSize, o.Buffers = ns, directBlockSize, 8
				})
				e := tr.Engine()
				require.Equal(t, c.fs, e.FS)
				require.Equal(t, c.direct, e.Direct, "the O_DIRECT probe: %q", e.NoDirect)
				if c.direct {
					require.Empty(t, e.NoDirect)
				} else {
					require.Contains(t, e.NoDirect, "the filesystem refuses O_DIRECT: invalid argument")
				}
				t.Logf("%s on %s: Direct %v %s", kind, e.FS, e.Direct, e.NoDirect)

				// The tier's aligned buffers, then buffers 512 bytes past a 4 KiB boundary.
				aligned := tr.Buffers()
				require.Len(t, aligned, 8)
				misaligned := make([][]byte, 4)
				for i := range misaligned {
					back := make([]byte, directBlockSize+4096)
					off := 512 + (4096-int(uintptr(unsafe.Pointer(&back[0]))%4096))%4096
					misaligned[i] = back[off : off+directBlockSize]
				}
				for name, bufs := range map[string][][]byte{"aligned": aligned[:4], "misaligned": misaligned} {
					base := map[string]int{"aligned": 0, "misaligned": 100}[name]
					idx := []int{base, base + 1, base + 2, base + 3}
					for j, i := range idx {
						copy(bufs[j], payload(i, directBlockSize))
					}
					require.NoError(t, tr.Store(1, keys(idx...), bufs))
					for j, k := range await(t, tr, 1)[1].Keys {
						require.Equal(t, tier.StatusStored, k.Status, "%s store of key %d: %v", name, idx[j], k.Err)
					}
					if c.uncached && name == "aligned" {
						assert.Zero(t, cachedPagesOf(t, tr, idx), "pages cached by direct stores")
					}
					dropCache(t, tr, idx)
					for j := range bufs {
						clear(bufs[j])
					}
					require.NoError(t, tr.Load(2, keys(idx...), bufs))
					for j, k := range await(t, tr, 2)[2].Keys {
						require.Equal(t, tier.StatusLoaded, k.Status, "%s load of key %d: %v", name, idx[j], k.Err)
						require.Equal(t, payload(idx[j], directBlockSize), bufs[j], "%s load of key %d", name, idx[j])
					}
					if c.uncached {
						n := cachedPagesOf(t, tr, idx)
						if name == "aligned" {
							assert.Zero(t, n, "pages cached by direct loads")
						} else {
							assert.Positive(t, n, "misaligned loads went around the page cache")
						}
					}
				}
				verifyClean(t, tr.BlockStore(), ns, c.name)
			})
		})
	}
}

// directWrite writes size bytes at offset 0 with O_DIRECT into a new file in dir, from a buffer
// aligned to 4 KiB.
func directWrite(dir string, size int) error {
	path := filepath.Join(dir, "direct-write")
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Unlink(path)
	defer unix.Close(fd)
	back := make([]byte, 2*4096)
	off := (4096 - int(uintptr(unsafe.Pointer(&back[0]))%4096)) % 4096
	_, err = unix.Pwrite(fd, back[off:off+size], 0)
	return err
}

// mountRamfs mounts a ramfs (no size limit, no O_DIRECT) on a fresh directory.
func mountRamfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, unix.Mount("ramfs", dir, "ramfs", 0, ""), "mount a ramfs on %s", dir)
	unmountLater(t, dir)
	return dir
}

// blockPath returns key i's block file in tr's namespace.
func blockPath(t *testing.T, tr *tier.Tier, i int) string {
	t.Helper()
	dir, err := tr.BlockStore().NamespaceDir(tr.Namespace())
	require.NoError(t, err)
	return filepath.Join(dir, string(tr.BlockStore().Layout().AppendPath(nil, key(i))))
}

// cachedPagesOf returns how many pages of the blocks of keys idx are in the page cache (mincore).
func cachedPagesOf(t *testing.T, tr *tier.Tier, idx []int) int {
	t.Helper()
	n := 0
	for _, i := range idx {
		f, err := os.Open(blockPath(t, tr, i))
		require.NoError(t, err)
		st, err := f.Stat()
		require.NoError(t, err)
		m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
		require.NoError(t, err)
		vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			t.Fatalf("mincore: %v", e)
		}
		for _, v := range vec {
			n += int(v & 1)
		}
		require.NoError(t, unix.Munmap(m))
		f.Close()
	}
	return n
}

// dropCache writes back and drops the pages of the blocks of keys idx.
func dropCache(t *testing.T, tr *tier.Tier, idx []int) {
	t.Helper()
	for _, i := range idx {
		f, err := os.Open(blockPath(t, tr, i))
		require.NoError(t, err)
		require.NoError(t, unix.Fdatasync(int(f.Fd())))
		require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
		f.Close()
	}
}
