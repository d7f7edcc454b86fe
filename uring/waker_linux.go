package uring

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Waker lets any goroutine end the owner's wait in SubmitAndWait.
//
// Why an eventfd with an armed READ: MSG_RING would need a ring per waking
// goroutine, and with SINGLE_ISSUER nobody else may enter the owner's ring.
// An eventfd costs one write(2) to wake, works on every kernel the tier
// supports, and the owner sees the wake-up as an ordinary CQE. Wakes are
// coalesced: only the first Wake after the owner re-arms writes to the fd.
type Waker struct {
	fd      int         // the eventfd; blocking, so the ring's READ waits instead of failing EAGAIN; immutable
	closed  atomic.Bool // set by Close
	pending atomic.Bool // a wake was written and not yet consumed by Rearm
	buf     [8]byte     // target of the armed READ; the kernel writes it, so it lives as long as the Waker
}

// NewWaker creates a Waker.
func NewWaker() (*Waker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("uring: eventfd: %w", err)
	}
	return &Waker{fd: fd}, nil
}

// Arm prepares sqe as a READ of the eventfd; its CQE (with userData)
// arrives after the next Wake. The owner re-arms after each such CQE.
func (w *Waker) Arm(sqe *SQE, userData uint64) {
	w.pending.Store(false)
	sqe.prepRW(OpRead, int32(w.fd), uintptr(unsafe.Pointer(&w.buf)), uint32(len(w.buf)), 0)
	sqe.UserData = userData
}

// Wake ends the owner's current or next wait. Safe from any goroutine; a
// Wake while one is pending costs no syscall.
func (w *Waker) Wake() error {
	if w.pending.Swap(true) {
		return nil
	}
	if err := SignalEventfd(w.fd); err != nil {
		return fmt.Errorf("uring: wake: %w", err)
	}
	return nil
}

// eventfdOne is what SignalEventfd adds to an eventfd's counter; shared
// and never written, so that a signal allocates nothing.
var eventfdOne = func() (b [8]byte) { binary.NativeEndian.PutUint64(b[:], 1); return }()

// SignalEventfd adds 1 to the counter of eventfd fd, waking a reader of it
// (a READ armed on a ring, Go's netpoller). The write(2) is raw, without
// the runtime's system call bookkeeping: it cannot block while the counter
// is below its maximum, near which a blocking eventfd's write would block
// and a non-blocking one's fails EAGAIN.
func SignalEventfd(fd int) error {
	if _, _, errno := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&eventfdOne[0])), uintptr(len(eventfdOne))); errno != 0 {
		return errno
	}
	return nil
}

// Close closes the eventfd; a second Close does nothing. Close the ring
// first (the armed READ writes into the Waker until the ring cancels it),
// and make sure no goroutine can call Wake any more: its write would go to
// whatever file reuses the descriptor number.
func (w *Waker) Close() error {
	if w.closed.Swap(true) {
		return nil
	}
	return unix.Close(w.fd)
}
