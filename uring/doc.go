// Package uring is a thin binding of Linux io_uring: ring setup, probing,
// preparing submission queue entries (SQEs), submitting and reaping
// completion queue entries (CQEs), and registering buffers and files.
//
// It is mechanism only: no goroutines, no maps, no policy. The tier package
// decides what to submit and when.
//
// # Threading
//
// A Ring belongs to one goroutine, its owner, which alone prepares, submits
// and reaps. Rings are created with IORING_SETUP_SINGLE_ISSUER and
// DEFER_TASKRUN where the kernel has them, which ties the ring to the OS
// thread that created it: the owner calls runtime.LockOSThread before New
// and stays locked for the ring's life. Other goroutines wake the owner
// through a Waker; they never touch the ring.
//
// # Memory
//
// Every path, buffer, Statx_t and Timespec whose address goes into an SQE is
// used by the kernel after Submit returns, until that operation's CQE has
// been reaped — including when the caller has long given up on it (a timed
// out, canceled or hung request still completes later). The caller keeps
// such memory reachable and unchanged until the CQE, and never reuses it
// earlier. Buffers from AllocBuffer live outside the Go heap and so can
// neither move nor be collected; the ring's own wait arguments live in the
// Ring. Closing a ring with requests in flight leaves the kernel to cancel
// them in the background, so their memory must outlive Close too.
//
// # Errors
//
// A CQE carries the raw result; CQE.Err converts a negative result to a
// syscall.Errno, the only errno conversion in the package, so callers wrap
// it once (for example in an *fs.PathError) and errors.Is works. EINTR is
// retried inside every system call here.
//
// Requires Linux 5.19 or newer for everything the tier uses (sparse
// fixed-file tables); Available says whether this machine qualifies and,
// if not, why.
package uring
