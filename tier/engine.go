package tier

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/uring"
	"golang.org/x/sys/unix"
)

// What both engines share: the filesystem's capabilities and the memory
// and directories around their programs.

func isCanceled(err error) bool {
	return errors.Is(err, syscall.ECANCELED) || errors.Is(err, syscall.EINTR)
}

// probeDirect says whether loads and stores can use O_DIRECT in dir, and if
// not why; with ring, also whether an asynchronous O_DIRECT read there
// that ends past the end of a file may report more than the file has
// (ringReadsMiscounted).
func probeDirect(dir string, opts Options, ring bool) (ok bool, why string, miscounted bool) {
	switch {
	case opts.NoDirect:
		return false, "disabled by Options.NoDirect", false
	case opts.BlockSize%blockstore.HeaderSize != 0:
		return false, fmt.Sprintf("block size %d is not a multiple of %d", opts.BlockSize, blockstore.HeaderSize), false
	}
	// Named as vLLM names its probes and temporary files (*_<digits>.tmp),
	// so that a probe a crash left behind is anyone's clean-up's.
	path := filepath.Join(dir, fmt.Sprintf(".direct-probe_%d.tmp", blockstore.NewTempToken()&(1<<63-1)))
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, fmt.Sprintf("the filesystem refuses O_DIRECT: %v", err), false
	}
	defer unix.Unlink(path)
	defer unix.Close(fd)
	buf, err := uring.AllocBuffer(2 * blockstore.HeaderSize)
	if err != nil {
		return false, err.Error(), false
	}
	inFlight := false
	defer func() {
		if !inFlight {
			uring.FreeBuffer(buf)
		}
	}()
	if _, err := unix.Pwrite(fd, buf[:blockstore.HeaderSize], 0); err != nil {
		return false, fmt.Sprintf("the filesystem refuses O_DIRECT writes: %v", err), false
	}
	if _, err := unix.Pread(fd, buf[:blockstore.HeaderSize], 0); err != nil {
		return false, fmt.Sprintf("the filesystem refuses O_DIRECT reads: %v", err), false
	}
	if ring {
		miscounted, inFlight = ringReadsMiscounted(fd, buf)
	}
	return true, "", miscounted
}

// ringReadsMiscounted says whether an asynchronous O_DIRECT read of fd, a
// file of one page, reports more than that page when it asks for buf, two
// (blockstore.Config.AsyncDirectReads): it reads in a kernel worker
// (IOSQE_ASYNC), as the io_uring engine reads on FUSE and NFS. Linux 6.18
// counted such a read in full on go-fuse's server (the tests' faultfs,
// whose files are FOPEN_DIRECT_IO), not on GlusterFS's client, bindfs
// (libfuse 2) or fuse-overlayfs (libfuse 3). If it cannot tell, it says
// yes; inFlight says the read may still be in the kernel (buf must stay).
func ringReadsMiscounted(fd int, buf []byte) (miscounted, inFlight bool) {
	r, err := uring.New(2, uring.Options{Disable: uring.FlagSingleIssuer | uring.FlagDeferTaskrun})
	if err != nil {
		return true, false
	}
	defer r.Close()
	s := r.GetSQE()
	s.PrepareRead(fd, buf, 0)
	s.Flags |= uring.SQEAsync
	var cqe [1]uring.CQE
	// As long as the probe's pread did: a hung server hangs Open either way.
	if _, err := r.SubmitAndWait(1, -1); err != nil || r.Reap(cqe[:]) != 1 {
		return true, true
	}
	return cqe[0].Res != blockstore.HeaderSize, false
}

// inlineSafe reports whether reads and writes in dir may be issued inline
// by a ring owner, and names the filesystem. io_uring first tries a read or
// write without blocking (IOCB_NOWAIT), in the owner's thread; local
// filesystems honour that and hand slow cases to kernel workers, but FUSE
// (measured: a direct-IO read waited for the FUSE server inside the owner's
// io_uring_enter) and network filesystems may block the owner. There every
// read and write carries IOSQE_ASYNC and goes straight to a kernel worker.
func inlineSafe(dir string) (bool, string) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, "unknown (" + err.Error() + ")"
	}
	switch uint32(st.Type) {
	case unix.EXT4_SUPER_MAGIC:
		return true, "ext4"
	case unix.XFS_SUPER_MAGIC:
		return true, "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return true, "btrfs"
	case unix.TMPFS_MAGIC:
		return true, "tmpfs"
	case unix.F2FS_SUPER_MAGIC:
		return true, "f2fs"
	case unix.BCACHEFS_SUPER_MAGIC:
		return true, "bcachefs"
	case unix.NFS_SUPER_MAGIC:
		return false, "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return false, "fuse"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return false, "overlayfs"
	}
	return false, fmt.Sprintf("0x%x", uint32(st.Type))
}

// alignedBytes returns n bytes of the Go heap aligned for O_DIRECT.
func alignedBytes(n int) []byte {
	b := make([]byte, n+blockstore.HeaderSize)
	off := -int(uintptr(unsafe.Pointer(&b[0]))) & (blockstore.HeaderSize - 1)
	return b[off : off+n : off+n]
}

// aligned reports whether b can be an O_DIRECT target.
func aligned(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%blockstore.HeaderSize == 0 && len(b)%blockstore.HeaderSize == 0
}

// InvalidateLookups empties the lookup cache, for a caller that changed the
// directory behind the tier's back. Lookups submitted after it neither
// share an op that started before it nor meet what such ops learn.
func (t *Tier) InvalidateLookups() { t.cacheEpoch.Add(1) }
