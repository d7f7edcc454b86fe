package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SetupFlags are the IORING_SETUP_* flags a ring was created with.
type SetupFlags uint32

// The setup flags New tries, newest first.
const (
	FlagCQSize       SetupFlags = setupCQSize       // the CQ has its own size (Options.CQEntries)
	FlagSubmitAll    SetupFlags = setupSubmitAll    // a failing SQE does not stop the rest of the batch
	FlagCoopTaskrun  SetupFlags = setupCoopTaskrun  // no IPI to interrupt the owner for completions
	FlagTaskrunFlag  SetupFlags = setupTaskrunFlag  // the kernel flags pending task work in the SQ ring
	FlagSingleIssuer SetupFlags = setupSingleIssuer // only the creating thread submits
	FlagDeferTaskrun SetupFlags = setupDeferTaskrun // completions run when the owner waits, not at random
	FlagNoSQArray    SetupFlags = setupNoSQArray    // SQEs are consumed in ring order, no index array
)

// optionalFlags is the order in which New drops flags on EINVAL: the newest
// kernel feature first, so that an older kernel keeps everything it knows.
// COOP_TASKRUN and TASKRUN_FLAG go together: the second needs the first (or
// DEFER_TASKRUN), and Reap relies on it to see completions parked as task work.
var optionalFlags = []SetupFlags{FlagNoSQArray, FlagDeferTaskrun, FlagSingleIssuer, FlagCoopTaskrun | FlagTaskrunFlag, FlagSubmitAll}

var flagNames = []struct {
	f    SetupFlags
	name string
}{
	{FlagCQSize, "CQSIZE"}, {FlagSubmitAll, "SUBMIT_ALL"}, {FlagCoopTaskrun, "COOP_TASKRUN"}, {FlagTaskrunFlag, "TASKRUN_FLAG"},
	{FlagSingleIssuer, "SINGLE_ISSUER"}, {FlagDeferTaskrun, "DEFER_TASKRUN"}, {FlagNoSQArray, "NO_SQARRAY"},
}

// String lists the flags by their kernel names, e.g. "SINGLE_ISSUER|DEFER_TASKRUN".
func (f SetupFlags) String() string {
	s := ""
	for _, n := range flagNames {
		if f&n.f != 0 {
			if s != "" {
				s += "|"
			}
			s += n.name
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// Features are the IORING_FEAT_* bits the kernel reported at setup.
type Features uint32

// Feature bits this package looks at.
const (
	FeatSingleMmap Features = featSingleMmap // SQ and CQ rings share one mapping
	FeatNoDrop     Features = featNoDrop     // the kernel keeps overflowed CQEs instead of dropping them
	FeatExtArg     Features = featExtArg     // waits take a timeout (EXT_ARG)
	FeatCQESkip    Features = featCQESkip    // IOSQE_CQE_SKIP_SUCCESS works
	FeatLinkedFile Features = featLinkedFile // a fixed file opened earlier in a link can be used later in it
)

// Options configure New. The zero value asks for every useful flag.
type Options struct {
	// CQEntries sizes the completion queue; 0 means twice the SQ entries.
	CQEntries uint32
	// Disable lists setup flags not to try (for tests and for kernels that
	// accept a flag but misbehave with it).
	Disable SetupFlags
	// RawSubmit has Submit (and Reap's flush) enter the kernel as a raw
	// system call: the goroutine keeps its P meanwhile, as for any work on
	// the CPU. Only for a ring whose submissions never sleep: its ops are
	// issued without waiting or handed to kernel workers, and no last
	// close of a file waits (a local filesystem; on NFS or FUSE a release
	// may wait for the server, and a sleeping raw call holds its P, which
	// no other goroutine can then have). As a blocking system call, an
	// enter past 20 µs (inline O_DIRECT issues, opens) had the runtime's
	// sysmon take the P back and wake another thread for it, and sysmon
	// then woke every 20 µs, each time on some CPU, preempting whatever
	// ran there.
	RawSubmit bool
}

// Ring is one io_uring instance: its mapped queues and its file descriptor.
//
// A Ring is not safe for concurrent use. Its owner goroutine prepares,
// submits and reaps; with FlagSingleIssuer that goroutine must also stay on
// the OS thread that called New (runtime.LockOSThread), because the kernel
// ties the ring to that thread. Other goroutines reach the owner through a
// Waker.
type Ring struct {
	fd        int        // ring file descriptor; -1 after Close
	flags     SetupFlags // flags in force, set by New
	features  Features   // kernel features, set by New
	rawSubmit bool       // Options.RawSubmit

	ringMem []byte // SQ and CQ ring mapping (one mapping with SINGLE_MMAP)
	cqMem   []byte // separate CQ mapping without SINGLE_MMAP, else nil
	sqeMem  []byte // the SQE array mapping

	// Shared with the kernel; accessed atomically where the kernel writes.
	sqHead    *uint32 // kernel advances as it consumes SQEs
	sqTail    *uint32 // we advance, published at Submit
	sqFlags   *uint32 // kernel sets IORING_SQ_CQ_OVERFLOW, IORING_SQ_TASKRUN
	sqMask    uint32
	sqEntries uint32
	sqes      []SQE

	cqHead    *uint32 // we advance as we reap
	cqFlags   *uint32 // we set IORING_CQ_EVENTFD_DISABLED; nil where the kernel has no CQ flags
	cqTail    *uint32 // kernel advances as it posts
	cqMask    uint32
	cqEntries uint32
	cqes      []CQE

	sqeTail uint32       // next SQE to hand out; owner-only
	waitArg geteventsArg // EXT_ARG for waits; owned by the Ring so a wait allocates nothing
	waitTS  Timespec     // the wait timeout that waitArg points to
}

// New creates a ring with at least entries SQ entries, trying the newest
// setup flags first and dropping one at a time when the kernel answers
// EINVAL. The error is an *UnavailableError when io_uring cannot be used.
func New(entries uint32, opts Options) (*Ring, error) {
	want := FlagSubmitAll | FlagCoopTaskrun | FlagTaskrunFlag | FlagSingleIssuer | FlagDeferTaskrun | FlagNoSQArray
	want &^= opts.Disable
	var p params
	for {
		p = params{flags: uint32(want) | setupClamp}
		if opts.CQEntries > 0 {
			p.flags |= setupCQSize
			p.cqEntries = opts.CQEntries
		}
		fd, err := setup(entries, &p)
		if err == nil {
			r := &Ring{fd: fd, flags: SetupFlags(p.flags) &^ setupClamp, features: Features(p.features), rawSubmit: opts.RawSubmit}
			if err := r.mmap(&p); err != nil {
				r.Close()
				return nil, err
			}
			return r, nil
		}
		if err != unix.EINVAL {
			return nil, setupError(err)
		}
		dropped := false
		for _, f := range optionalFlags {
			if want&f != 0 {
				want &^= f
				dropped = true
				break
			}
		}
		if !dropped {
			return nil, fmt.Errorf("uring: io_uring_setup(%d): %w", entries, err)
		}
	}
}

func setup(entries uint32, p *params) (int, error) {
	for {
		fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return -1, errno
		}
		return int(fd), nil
	}
}

func (r *Ring) mmap(p *params) error {
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	if SetupFlags(p.flags)&FlagNoSQArray != 0 {
		sqSize = int(p.sqOff.array) // the kernel reports 0 here: no array to map
	}
	cqSize := int(p.cqOff.cqes + p.cqEntries*sizeofCQE)
	single := Features(p.features)&FeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	r.ringMem, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap SQ ring: %w", err)
	}
	cqMem := r.ringMem
	if !single {
		r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("uring: mmap CQ ring: %w", err)
		}
		cqMem = r.cqMem
	}
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*sizeofSQE, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap SQEs: %w", err)
	}

	u32 := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead = u32(r.ringMem, p.sqOff.head)
	r.sqTail = u32(r.ringMem, p.sqOff.tail)
	r.sqFlags = u32(r.ringMem, p.sqOff.flags)
	r.sqMask = *u32(r.ringMem, p.sqOff.ringMask)
	r.sqEntries = *u32(r.ringMem, p.sqOff.ringEntries)
	r.sqes = unsafe.Slice((*SQE)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	if r.flags&FlagNoSQArray == 0 {
		// Without NO_SQARRAY the kernel reads SQE indexes from this array;
		// an identity map lets us use the SQEs in ring order (as liburing does).
		array := unsafe.Slice(u32(r.ringMem, p.sqOff.array), p.sqEntries)
		for i := range array {
			array[i] = uint32(i)
		}
	}
	r.cqHead = u32(cqMem, p.cqOff.head)
	r.cqTail = u32(cqMem, p.cqOff.tail)
	if p.cqOff.flags != 0 {
		r.cqFlags = u32(cqMem, p.cqOff.flags)
	}
	r.cqMask = *u32(cqMem, p.cqOff.ringMask)
	r.cqEntries = *u32(cqMem, p.cqOff.ringEntries)
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&cqMem[p.cqOff.cqes])), p.cqEntries)
	r.sqeTail = atomic.LoadUint32(r.sqTail)
	return nil
}

// NotifyEventfd turns the registered eventfd's signals on or off
// (IORING_CQ_EVENTFD_DISABLED): an owner that reaps as it goes needs them
// only while it sleeps. The kernel reads the flag as it posts, so a
// completion posted just before notifications are turned on may not
// signal: check Ready after turning them on, before sleeping. It reports
// whether the kernel has the flag; without it, signals stay on.
func (r *Ring) NotifyEventfd(on bool) bool {
	if r.cqFlags == nil {
		return false
	}
	if on {
		atomic.AndUint32(r.cqFlags, ^uint32(cqEventfdDisabled))
	} else {
		atomic.OrUint32(r.cqFlags, cqEventfdDisabled)
	}
	return true
}

// Flags returns the setup flags in force.
func (r *Ring) Flags() SetupFlags { return r.flags }

// Features returns the features the kernel reported.
func (r *Ring) Features() Features { return r.features }

// RawSubmit reports whether the ring submits with raw system calls
// (Options.RawSubmit).
func (r *Ring) RawSubmit() bool { return r.rawSubmit }

// SQEntries returns the size of the submission queue.
func (r *Ring) SQEntries() uint32 { return r.sqEntries }

// CQEntries returns the size of the completion queue.
func (r *Ring) CQEntries() uint32 { return r.cqEntries }

// FD returns the ring's file descriptor, or -1 after Close.
func (r *Ring) FD() int { return r.fd }

// Close unmaps the queues and closes the ring. Requests still in flight are
// canceled by the kernel, which finishes them in the background: memory they
// reference must stay valid until they end, so a caller with requests stuck
// in a hung filesystem keeps their buffers rather than reusing them.
// Closing a closed ring does nothing and returns nil.
func (r *Ring) Close() error {
	if r.fd < 0 {
		return nil
	}
	var errs []error
	for _, m := range []*[]byte{&r.sqeMem, &r.cqMem, &r.ringMem} {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	r.sqes, r.cqes = nil, nil
	errs = append(errs, unix.Close(r.fd))
	r.fd = -1
	return errors.Join(errs...)
}

// GetSQE returns the next free SQE, zeroed, or nil when the submission queue
// is full: the caller submits (or reaps and submits) and tries again. An SQE
// is handed to the kernel by the next Submit.
func (r *Ring) GetSQE() *SQE {
	head := atomic.LoadUint32(r.sqHead)
	if r.sqeTail-head >= r.sqEntries {
		return nil
	}
	sqe := &r.sqes[r.sqeTail&r.sqMask]
	*sqe = SQE{}
	r.sqeTail++
	return sqe
}

// SQTail returns how many SQEs GetSQE has handed out, wrapping: the
// position past the latest one, for Taken.
func (r *Ring) SQTail() uint32 { return r.sqeTail }

// Taken reports whether the kernel has taken every SQE handed out before
// pos (an SQTail): once it has, it may be running them, whatever a later
// Submit reports.
func (r *Ring) Taken(pos uint32) bool {
	return int32(atomic.LoadUint32(r.sqHead)-pos) >= 0
}

// SQSpace returns how many SQEs GetSQE can still hand out before a Submit.
func (r *Ring) SQSpace() uint32 {
	return r.sqEntries - (r.sqeTail - atomic.LoadUint32(r.sqHead))
}

// Pending returns how many prepared SQEs the next Submit hands to the kernel.
func (r *Ring) Pending() uint32 {
	return r.sqeTail - atomic.LoadUint32(r.sqTail)
}

// Submit hands every prepared SQE to the kernel with one io_uring_enter and
// returns how many it took; it waits for no completion (a raw system call
// with Options.RawSubmit). EINTR is retried. When the kernel cannot take
// them now (EBUSY: completions must be reaped first; EAGAIN: out of memory
// for requests) the error matches ErrRetry and the SQEs stay queued.
func (r *Ring) Submit() (int, error) {
	return r.enter(0, 0)
}

// SubmitAndWait submits like Submit, then waits until at least waitNr
// completions can be reaped or timeout passes (timeout < 0: no limit;
// timeout == 0: do not wait). A timeout is not an error.
func (r *Ring) SubmitAndWait(waitNr uint32, timeout time.Duration) (int, error) {
	if timeout == 0 {
		waitNr = 0
	}
	return r.enter(waitNr, timeout)
}

func (r *Ring) enter(waitNr uint32, timeout time.Duration) (int, error) {
	atomic.StoreUint32(r.sqTail, r.sqeTail)
	toSubmit := r.sqeTail - atomic.LoadUint32(r.sqHead)
	var flags uint32
	var arg unsafe.Pointer
	var argSize uintptr
	if waitNr > 0 || r.needsEnterForCQ() {
		flags |= enterGetEvents
	}
	if waitNr > 0 && timeout > 0 {
		if r.features&FeatExtArg == 0 {
			return 0, fmt.Errorf("uring: wait with timeout needs IORING_FEAT_EXT_ARG (Linux 5.11)")
		}
		r.waitTS = Timespec{Sec: int64(timeout / time.Second), Nsec: int64(timeout % time.Second)}
		r.waitArg = geteventsArg{ts: uint64(uintptr(unsafe.Pointer(&r.waitTS)))}
		flags |= enterExtArg
		arg = unsafe.Pointer(&r.waitArg)
		argSize = sizeofGeteventsArg
	}
	if toSubmit == 0 && flags == 0 {
		return 0, nil
	}
	syscall6 := r.enterCall(waitNr > 0)
	for {
		n, _, errno := syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(waitNr), uintptr(flags), uintptr(arg), argSize)
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		case unix.ETIME:
			// The wait timed out; the SQEs were submitted (the kernel
			// submits before it waits).
			return int(toSubmit - (r.sqeTail - atomic.LoadUint32(r.sqHead))), nil
		case unix.EBUSY, unix.EAGAIN:
			return int(n), fmt.Errorf("uring: io_uring_enter: %w", &retryError{errno})
		case unix.EEXIST:
			return 0, fmt.Errorf("uring: io_uring_enter from a thread other than the ring's single issuer (call runtime.LockOSThread before New and keep the owner goroutine on it): %w", errno)
		default:
			return 0, fmt.Errorf("uring: io_uring_enter: %w", errnoErr(int32(errno)))
		}
	}
}

// needsEnterForCQ reports whether completions are waiting in the kernel
// rather than in the CQ: overflowed CQEs (kept with FEAT_NODROP) or, with
// COOP/DEFER_TASKRUN, task work that only a GETEVENTS enter runs.
func (r *Ring) needsEnterForCQ() bool {
	return atomic.LoadUint32(r.sqFlags)&(sqCQOverflow|sqTaskrun) != 0
}

// Reap copies up to len(dst) completions into dst, in the order the kernel
// posted them, frees their CQ slots and returns how many it copied. It never
// blocks and never allocates. When the CQ is empty but the kernel holds
// overflowed completions or pending task work, Reap flushes them with one
// non-blocking io_uring_enter first, so no completion is lost.
func (r *Ring) Reap(dst []CQE) int {
	n := r.copyCQ(dst)
	if n == 0 && len(dst) > 0 && r.needsEnterForCQ() {
		r.flushCQ()
		n = r.copyCQ(dst)
	}
	return n
}

// Ready returns how many completions Reap can copy now without entering
// the kernel.
func (r *Ring) Ready() uint32 {
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

func (r *Ring) copyCQ(dst []CQE) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for head != tail && n < len(dst) {
		dst[n] = r.cqes[head&r.cqMask]
		head++
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// enterCall is the system call an io_uring_enter makes: a raw one with
// Options.RawSubmit, unless it waits for completions.
func (r *Ring) enterCall(waits bool) func(trap, a1, a2, a3, a4, a5, a6 uintptr) (uintptr, uintptr, unix.Errno) {
	if r.rawSubmit && !waits {
		return unix.RawSyscall6
	}
	return unix.Syscall6
}

func (r *Ring) flushCQ() {
	syscall6 := r.enterCall(false)
	for {
		_, _, errno := syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, 0, enterGetEvents, 0, 0)
		if errno != unix.EINTR {
			return
		}
	}
}

// errnoErr turns a kernel errno into the syscall.Errno value every caller
// compares with; it is the one place this package converts an errno.
func errnoErr(e int32) error {
	return syscall.Errno(e)
}
