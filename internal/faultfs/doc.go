// Package faultfs is a FUSE pass-through filesystem with fault injection, for tests that need a slow,
// hung or failing filesystem (a stand-in for an NFS server) on a machine where NFS cannot be mounted.
//
// Mount serves a view of a real directory through the kernel's FUSE driver (go-fuse's loopback node);
// Inject installs a Fault: for the operation kinds in Fault.Ops whose path matches Fault.Path, add
// latency, hang until released, and/or fail with an errno. Each installed Rule counts the operations it
// matched, so a test can assert that its fault reached the filesystem and not only that the caller saw
// an error:
//
//	if err := faultfs.Available(); err != nil {
//		t.Skip(err)
//	}
//	fsys, err := faultfs.Mount(t.TempDir(), backing, faultfs.Options{})
//	require.NoError(t, err)
//	defer fsys.Unmount()
//	rule, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpRead, Path: "blocks/*", Errno: syscall.EIO})
//	...
//	require.ErrorIs(t, err, syscall.EIO)
//	require.Positive(t, rule.Fired())
//
// # What the caller sees
//
// A fault is answered to the kernel as an errno, and the kernel hands exactly that errno to the system
// call that caused the request, so errors.Is(err, syscall.ESTALE) works on the caller's side; no Go
// sentinel can cross the kernel, which is why rules count instead. Which requests a system call sends
// is the kernel's business: open(2) of "a/b" sends LOOKUP "a", LOOKUP "a/b", then OPEN; close(2) sends
// FLUSH and, after the last close, RELEASE, which the caller does not wait for. With the default
// Options nothing is cached by the kernel (entry and attribute timeouts are 0, files are opened with
// FOPEN_DIRECT_IO), so every lookup, stat, read and write reaches the rules. Even so the kernel answers
// some things itself: the mount root, "." and ".." are never looked up, and with Options.PageCache or
// non-zero timeouts it serves what it has cached. A failed lookup is not cached either (negative timeout
// 0). Direct IO has a cost: the kernel may refuse a shared mmap of a file (set PageCache for that).
//
// # Threading model
//
// go-fuse serves each FUSE request on its own goroutine, so a hung or slow operation holds only its own
// request (and the caller's thread, which is blocked in the kernel); others proceed. The rule list is
// copy-on-write: operations read it without locks, and Inject, Rule.Remove, Release and Reset may be
// called at any time from any goroutine, also while operations hang. A hang ends at Rule.Release,
// FS.Release, Rule.Remove, FS.Reset or Unmount; a kernel interrupt (the caller got a signal) ends it
// with EINTR only if the fault is Interruptible. Released operations then go on as the fault says.
//
// The process that mounts may use the mount itself (tests do): the server's goroutines never wait for
// the callers', and a caller blocked in a system call does not hold up the Go runtime. Do not mmap files
// of the mount in the same process while a fault may hang: a page fault then blocks a thread outside a
// system call, which can stall the garbage collector.
//
// # Unmount
//
// Unmount first closes the FS to faults (wakes every hang and latency; later operations pass through),
// then unmounts. If the mount is still busy (descriptors left open) it detaches it lazily and aborts the
// FUSE connection through /sys/fs/fuse/connections/N/abort, so the open descriptors fail with ENOTCONN
// and the server stops. It returns once the server's goroutines have exited.
//
// # Requirements
//
// /dev/fuse, root (for umount2 and the fusectl abort; mounting itself goes through fusermount3), and
// fusermount3 from Debian's fuse3 package. Available says which is missing.
package faultfs
