package uring

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Preparing SQEs. Each Prepare* mirrors the liburing helper of the same name
// (src/include/liburing.h, io_uring_prep_*), filling the fields that
// helper fills. They only write the SQE; nothing reaches the kernel before
// Submit.
//
// The memory rule: a path, buffer, Statx_t or Timespec passed here is read
// or written by the kernel after Submit returns, possibly from a kernel
// worker, until the operation's CQE is reaped. The caller keeps it
// reachable and does not reuse it until then, even when it has given up on
// the operation (a canceled or timed-out request may still complete). Paths
// must be NUL-terminated; use the memory of a long-lived, pinned or mmap'd
// object (AllocBuffer) rather than a temporary. Go's collector does not move
// heap objects, so reachability is what the caller must guarantee; the
// tier's operation slots are pinned and never recycled before their CQE.

// escapeNever is never true; escape makes its argument escape to the heap.
var (
	escapeNever bool
	escapeSink  unsafe.Pointer
)

// escape enforces the first half of the memory rule at compile time: every
// pointer handed to the kernel escapes, so the compiler never places it on a
// goroutine stack, which moves when it grows. (Escape analysis does not see
// that the store never runs.)
func escape(p unsafe.Pointer) {
	if escapeNever {
		escapeSink = p
	}
}

// prepRW is liburing's io_uring_prep_rw.
func (s *SQE) prepRW(op Opcode, fd int32, addr uintptr, length uint32, off uint64) {
	s.Opcode = op
	s.FD = fd
	s.Addr = uint64(addr)
	s.Len = length
	s.Off = off
}

func bytesAddr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	escape(p)
	return uintptr(p)
}

func ptrAddr[T any](p *T) uintptr {
	escape(unsafe.Pointer(p))
	return uintptr(unsafe.Pointer(p))
}

// PrepareNop prepares IORING_OP_NOP.
func (s *SQE) PrepareNop() {
	s.prepRW(OpNop, -1, 0, 0, 0)
}

// PrepareStatx prepares IORING_OP_STATX of path (NUL-terminated) relative
// to dirfd, writing into stx.
func (s *SQE) PrepareStatx(dirfd int, path *byte, flags int, mask uint32, stx *unix.Statx_t) {
	s.prepRW(OpStatx, int32(dirfd), ptrAddr(path), mask, uint64(ptrAddr(stx)))
	s.OpFlags = uint32(flags)
}

// PrepareOpenat prepares IORING_OP_OPENAT; the CQE's Res is the new fd.
func (s *SQE) PrepareOpenat(dirfd int, path *byte, flags int, mode uint32) {
	s.prepRW(OpOpenat, int32(dirfd), ptrAddr(path), mode, 0)
	s.OpFlags = uint32(flags)
}

// PrepareOpenatDirect prepares IORING_OP_OPENAT into fixed-file slot
// (io_uring_prep_openat_direct); the file is used with SQEFixedFile and
// the slot index as fd. The kernel refuses O_CLOEXEC here (fixed files have
// no fd to inherit). The CQE's Res is 0 on success.
func (s *SQE) PrepareOpenatDirect(dirfd int, path *byte, flags int, mode uint32, slot uint32) {
	s.PrepareOpenat(dirfd, path, flags, mode)
	s.FileIndex = slot + 1 // __io_uring_set_target_fixed_file: 0 means "no slot"
}

// PrepareOpenat2 prepares IORING_OP_OPENAT2 (io_uring_prep_openat2): an
// openat2(2) whose how, with its RESOLVE_* flags, the kernel reads when the
// operation runs, so it follows the memory rule like a path. The CQE's Res
// is the new fd.
func (s *SQE) PrepareOpenat2(dirfd int, path *byte, how *unix.OpenHow) {
	s.prepRW(OpOpenat2, int32(dirfd), ptrAddr(path), unix.SizeofOpenHow, uint64(ptrAddr(how)))
}

// PrepareOpenat2Direct prepares IORING_OP_OPENAT2 into fixed-file slot
// (io_uring_prep_openat2_direct); the CQE's Res is 0 on success.
func (s *SQE) PrepareOpenat2Direct(dirfd int, path *byte, how *unix.OpenHow, slot uint32) {
	s.PrepareOpenat2(dirfd, path, how)
	s.FileIndex = slot + 1
}

// PrepareClose prepares IORING_OP_CLOSE of a plain fd.
func (s *SQE) PrepareClose(fd int) {
	s.prepRW(OpClose, int32(fd), 0, 0, 0)
}

// PrepareCloseDirect prepares IORING_OP_CLOSE of a fixed-file slot
// (io_uring_prep_close_direct).
func (s *SQE) PrepareCloseDirect(slot uint32) {
	s.prepRW(OpClose, 0, 0, 0, 0)
	s.FileIndex = slot + 1
}

// PrepareRead prepares IORING_OP_READ of len(buf) bytes at offset off.
// With SQEFixedFile in Flags, fd is a fixed-file slot.
func (s *SQE) PrepareRead(fd int, buf []byte, off uint64) {
	s.prepRW(OpRead, int32(fd), bytesAddr(buf), uint32(len(buf)), off)
}

// PrepareReadv prepares IORING_OP_READV into the buffers of iov at offset
// off: one read that fills them in turn. The iovecs and their buffers
// follow the memory rule.
func (s *SQE) PrepareReadv(fd int, iov []unix.Iovec, off uint64) {
	s.prepRW(OpReadv, int32(fd), ptrAddr(unsafe.SliceData(iov)), uint32(len(iov)), off)
}

// PrepareWritev prepares IORING_OP_WRITEV of the buffers of iov at offset
// off: one write of them in turn. The iovecs and their buffers follow the
// memory rule.
func (s *SQE) PrepareWritev(fd int, iov []unix.Iovec, off uint64) {
	s.prepRW(OpWritev, int32(fd), ptrAddr(unsafe.SliceData(iov)), uint32(len(iov)), off)
}

// PrepareWrite prepares IORING_OP_WRITE of buf at offset off.
func (s *SQE) PrepareWrite(fd int, buf []byte, off uint64) {
	s.prepRW(OpWrite, int32(fd), bytesAddr(buf), uint32(len(buf)), off)
}

// PrepareReadFixed prepares IORING_OP_READ_FIXED into buf, which must lie
// inside registered buffer bufIndex.
func (s *SQE) PrepareReadFixed(fd int, buf []byte, off uint64, bufIndex uint16) {
	s.prepRW(OpReadFixed, int32(fd), bytesAddr(buf), uint32(len(buf)), off)
	s.BufIndex = bufIndex
}

// PrepareWriteFixed prepares IORING_OP_WRITE_FIXED from buf, which must
// lie inside registered buffer bufIndex.
func (s *SQE) PrepareWriteFixed(fd int, buf []byte, off uint64, bufIndex uint16) {
	s.prepRW(OpWriteFixed, int32(fd), bytesAddr(buf), uint32(len(buf)), off)
	s.BufIndex = bufIndex
}

// PrepareFsync prepares IORING_OP_FSYNC; datasync asks for fdatasync.
func (s *SQE) PrepareFsync(fd int, datasync bool) {
	s.prepRW(OpFsync, int32(fd), 0, 0, 0)
	if datasync {
		s.OpFlags = fsyncDatasync
	}
}

// PrepareRenameat prepares IORING_OP_RENAMEAT (renameat2 flags).
func (s *SQE) PrepareRenameat(oldDirfd int, oldPath *byte, newDirfd int, newPath *byte, flags uint32) {
	s.prepRW(OpRenameat, int32(oldDirfd), ptrAddr(oldPath), uint32(newDirfd), uint64(ptrAddr(newPath)))
	s.OpFlags = flags
}

// PrepareUnlinkat prepares IORING_OP_UNLINKAT (flags: unix.AT_REMOVEDIR).
func (s *SQE) PrepareUnlinkat(dirfd int, path *byte, flags int) {
	s.prepRW(OpUnlinkat, int32(dirfd), ptrAddr(path), 0, 0)
	s.OpFlags = uint32(flags)
}

// PrepareMkdirat prepares IORING_OP_MKDIRAT.
func (s *SQE) PrepareMkdirat(dirfd int, path *byte, mode uint32) {
	s.prepRW(OpMkdirat, int32(dirfd), ptrAddr(path), mode, 0)
}

// PrepareLinkTimeout prepares IORING_OP_LINK_TIMEOUT for the SQE before it,
// which must carry SQEIOLink: if that operation has not completed by ts
// (relative), the kernel cancels it (its CQE says ECANCELED, or EINTR for
// an operation interrupted mid-way) and this one completes with ETIME;
// otherwise this one completes with ECANCELED.
func (s *SQE) PrepareLinkTimeout(ts *Timespec) {
	s.prepRW(OpLinkTimeout, -1, ptrAddr(ts), 1, 0)
}

// PrepareCancel prepares IORING_OP_ASYNC_CANCEL of the request whose
// user_data is target (flags: CancelAll, CancelAny). Its CQE's Res is 0
// when a request was found and canceled, ENOENT when none matched and
// EALREADY when the request is running and could only be signalled.
func (s *SQE) PrepareCancel(target uint64, flags uint32) {
	s.prepRW(OpAsyncCancel, -1, 0, 0, 0)
	s.Addr = target
	s.OpFlags = flags
}
