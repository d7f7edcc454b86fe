package uring

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AllocBuffer returns size bytes of anonymous, page-aligned memory outside
// the Go heap: it never moves, is never collected, and its alignment suits
// O_DIRECT and registered buffers. Memory of HugePage bytes or more starts
// on a HugePage boundary and asks for transparent huge pages
// (MADV_HUGEPAGE; a hint, which a kernel with them off ignores): a read or
// write then pins, and the kernel copies, a few large pages instead of 512
// small ones a huge page. Release it with FreeBuffer once no request uses
// it.
func AllocBuffer(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("uring: buffer size %d", size)
	}
	n := pageUp(size)
	extra := 0
	if size >= HugePage {
		extra = HugePage // room to start on a boundary; trimmed below
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n+extra), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("uring: mmap %d-byte buffer: %w", size, err)
	}
	if extra > 0 {
		head := -int(uintptr(p)) & (HugePage - 1)
		if head > 0 {
			unix.MunmapPtr(p, uintptr(head))
		}
		if tail := extra - head; tail > 0 {
			unix.MunmapPtr(unsafe.Add(p, head+n), uintptr(tail))
		}
		p = unsafe.Add(p, head)
		unix.Madvise(unsafe.Slice((*byte)(p), n), unix.MADV_HUGEPAGE) // EINVAL without THP: small pages, as before
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// HugePage is the size of a transparent huge page that AllocBuffer asks
// for (x86-64's and arm64's PMD size with 4 KiB pages).
const HugePage = 2 << 20

// FreeBuffer releases memory from AllocBuffer.
func FreeBuffer(b []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(pageUp(cap(b))))
}

// pageUp rounds n up to a multiple of the page size.
func pageUp(n int) int {
	page := unix.Getpagesize()
	return (n + page - 1) &^ (page - 1)
}

// RegisterBuffers registers bufs for READ_FIXED and WRITE_FIXED
// (IORING_REGISTER_BUFFERS); buffer i is bufIndex i. The kernel pins their
// pages until UnregisterBuffers or Close.
func (r *Ring) RegisterBuffers(bufs [][]byte) error {
	iov := make([]unix.Iovec, len(bufs))
	for i, b := range bufs {
		iov[i].Base = unsafe.SliceData(b)
		iov[i].SetLen(len(b))
	}
	if err := r.register(registerBuffers, unsafe.Pointer(unsafe.SliceData(iov)), uintptr(len(iov))); err != nil {
		return fmt.Errorf("uring: IORING_REGISTER_BUFFERS (%d buffers): %w", len(bufs), err)
	}
	return nil
}

// UnregisterBuffers drops the registered buffers.
func (r *Ring) UnregisterBuffers() error {
	if err := r.register(unregisterBuffers, nil, 0); err != nil {
		return fmt.Errorf("uring: IORING_UNREGISTER_BUFFERS: %w", err)
	}
	return nil
}

// RegisterFilesSparse creates a fixed-file table of n empty slots
// (IORING_REGISTER_FILES2 with IORING_RSRC_REGISTER_SPARSE, Linux 5.19),
// which PrepareOpenatDirect fills and PrepareCloseDirect empties.
func (r *Ring) RegisterFilesSparse(n uint32) error {
	reg := rsrcRegister{nr: n, flags: rsrcRegisterSparse}
	if err := r.register(registerFiles2, unsafe.Pointer(&reg), sizeofRsrcRegister); err != nil {
		return fmt.Errorf("uring: IORING_REGISTER_FILES2 (sparse, %d slots): %w", n, err)
	}
	return nil
}

// UpdateFiles sets the fixed-file slots from off on to fds, closing the
// files they held; -1 empties a slot (IORING_REGISTER_FILES_UPDATE). A
// slot must not be in use by a request in flight. fds must not be on the
// stack.
func (r *Ring) UpdateFiles(off uint32, fds []int32) error {
	upd := struct {
		offset uint32
		resv   uint32
		fds    uint64
	}{offset: off, fds: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(fds))))}
	err := r.register(registerFilesUpdate, unsafe.Pointer(&upd), uintptr(len(fds)))
	runtime.KeepAlive(fds)
	if err != nil {
		return fmt.Errorf("uring: IORING_REGISTER_FILES_UPDATE (%d slots from %d): %w", len(fds), off, err)
	}
	return nil
}

// UnregisterFiles drops the fixed-file table, closing the files in it.
func (r *Ring) UnregisterFiles() error {
	if err := r.register(unregisterFiles, nil, 0); err != nil {
		return fmt.Errorf("uring: IORING_UNREGISTER_FILES: %w", err)
	}
	return nil
}

// SetIOWQMaxWorkers limits the kernel worker threads serving this ring
// (IORING_REGISTER_IOWQ_MAX_WORKERS, Linux 5.15): bounded workers do
// regular-file and block IO, unbounded ones do everything else, path
// lookups included. A hung filesystem then holds at most that many workers
// instead of a new one per request. Zero leaves a limit unchanged. It
// returns the previous limits.
func (r *Ring) SetIOWQMaxWorkers(bounded, unbounded uint32) (prevBounded, prevUnbounded uint32, err error) {
	vals := [2]uint32{bounded, unbounded}
	if err := r.register(registerIOWQMaxWorkers, unsafe.Pointer(&vals), 2); err != nil {
		return 0, 0, fmt.Errorf("uring: IORING_REGISTER_IOWQ_MAX_WORKERS: %w", err)
	}
	return vals[0], vals[1], nil
}

// RegisterEventfd makes the kernel signal the eventfd fd whenever it posts
// completions and, on a DEFER_TASKRUN ring, whenever it queues deferred
// task work that an io_uring_enter with GETEVENTS must run
// (IORING_REGISTER_EVENTFD, io_uring_register(2)). An owner can then sleep
// on fd in an event loop instead of inside io_uring_enter. Closing the
// ring drops the registration.
func (r *Ring) RegisterEventfd(fd int) error {
	fd32 := int32(fd)
	if err := r.register(registerEventfd, unsafe.Pointer(&fd32), 1); err != nil {
		return fmt.Errorf("uring: IORING_REGISTER_EVENTFD: %w", err)
	}
	return nil
}

// NeedsEnter reports whether completions wait in the kernel rather than
// in the CQ: overflowed CQEs, or deferred task work that only an
// io_uring_enter with GETEVENTS (Submit, or Reap on an empty CQ) runs. It
// needs IORING_SETUP_TASKRUN_FLAG to see task work.
func (r *Ring) NeedsEnter() bool { return r.needsEnterForCQ() }
