package uring

import (
	"errors"
	"os"
	"strings"
	"syscall"
)

// ErrRetry matches a Submit that the kernel could not take now (EBUSY:
// reap completions first; EAGAIN: no memory for requests). The SQEs stay
// queued; reap, then submit again.
var ErrRetry = errors.New("uring: kernel busy, reap and retry")

type retryError struct{ errno syscall.Errno }

func (e *retryError) Error() string        { return e.errno.Error() + " (reap completions and retry)" }
func (e *retryError) Is(target error) bool { return target == ErrRetry || target == e.errno }
func (e *retryError) Unwrap() error        { return e.errno }

// ErrUnavailable matches every *UnavailableError.
var ErrUnavailable = errors.New("uring: io_uring unavailable")

// UnavailableError says why io_uring cannot be used here and what to do.
type UnavailableError struct {
	Reason  string   // what is wrong and what to do about it
	Err     error    // the underlying errno, if any
	Missing []Opcode // opcodes the kernel lacks, when that is the reason
}

func (e *UnavailableError) Error() string {
	s := "uring: io_uring unavailable: " + e.Reason
	if len(e.Missing) > 0 {
		names := make([]string, len(e.Missing))
		for i, op := range e.Missing {
			names[i] = op.String()
		}
		s += " (missing: " + strings.Join(names, ", ") + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the errno.
func (e *UnavailableError) Unwrap() error { return e.Err }

// disabledSysctl is where the kernel's io_uring switch lives (Linux 6.6+).
var disabledSysctl = "/proc/sys/kernel/io_uring_disabled"

// setupError explains a failed io_uring_setup.
func setupError(err error) error {
	switch err {
	case syscall.ENOSYS:
		return &UnavailableError{Err: err, Reason: "io_uring_setup is not implemented: the kernel is older than 5.1, " +
			"was built without CONFIG_IO_URING, or a seccomp profile hides the call; use Linux 5.19 or newer, or the sync engine"}
	case syscall.EPERM, syscall.EACCES:
		if b, rerr := os.ReadFile(disabledSysctl); rerr == nil {
			switch strings.TrimSpace(string(b)) {
			case "2":
				return &UnavailableError{Err: err, Reason: "disabled by sysctl kernel.io_uring_disabled=2; set it to 0 (sysctl -w kernel.io_uring_disabled=0) or use the sync engine"}
			case "1":
				return &UnavailableError{Err: err, Reason: "restricted by sysctl kernel.io_uring_disabled=1 to the group in kernel.io_uring_group; " +
					"add this user to that group, set the sysctl to 0, or use the sync engine"}
			}
		}
		return &UnavailableError{Err: err, Reason: "io_uring_setup was refused, most likely by a container's seccomp profile " +
			"(Docker's default blocks io_uring): run with a profile that allows io_uring_setup, io_uring_enter and io_uring_register, or use the sync engine"}
	case syscall.ENOMEM:
		return &UnavailableError{Err: err, Reason: "the kernel could not allocate the ring; raise RLIMIT_MEMLOCK (ulimit -l) on kernels older than 5.12, or use fewer or smaller rings"}
	case syscall.EMFILE, syscall.ENFILE:
		return &UnavailableError{Err: err, Reason: "no file descriptor for the ring; raise the open-files limit"}
	}
	return &UnavailableError{Err: err, Reason: "io_uring_setup failed"}
}
