package blockstore

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A lease makes one process at a time, among the processes and hosts that
// share a directory, the one that maintains it (evicts from it). The lease
// is a write lock on the whole of a file in the directory, LeaseName: an
// open file description (OFD) lock, fcntl(2) F_OFD_SETLK, so that it
// belongs to the Lease's descriptor rather than to the process and two
// Leases in one process exclude each other as two processes do. The kernel
// drops it when the holder closes the descriptor or dies; a GlusterFS
// brick when the client releases the file (its process died) or its
// connection goes; an NFSv4 server when the client's lease on the server
// lapses (the client stopped renewing: it died or is cut off).
//
// Tested (linux_test/lease_linux_test.go): on local filesystems, and
// through GlusterFS's FUSE client, where FUSE sends the OFD lock's owner
// (the open file) with each lock request and the brick's locks translator
// arbitrates: a second open file through the same client and one through
// another client are both refused (EAGAIN), and a SIGKILLed holder's lease
// is taken through another client within milliseconds. NFSv4 is not tested
// here (no NFS server on the test machines); the Linux NFS client sends OFD
// locks to the server with the open file as the lock owner.
//
// Where F_OFD_SETLK fails with EINVAL (a filesystem whose lock method does
// not take OFD locks), TryLease falls back to a classic POSIX lock
// (F_SETLK), which belongs to the process: the package then keeps
// exclusion between Leases of one process itself, and ReadLease reads such
// a file through the holder's descriptor, but a close(2) of any other
// descriptor of the lease file anywhere in the process (code outside this
// package opening it) silently releases the lock. fcntl(2) describes both
// kinds ("Open file description locks (non-POSIX)").
//
// The file holds the holder's line (who, e.g. "host pid 123") and then the
// state the holder publishes for the others, both written with pwrite(2)
// in place: the file is never renamed over, which would leave the lock on
// an unlinked inode.

// LeaseName is the lease file's name in the leased directory. '~' cannot
// start a namespace and no layout's block or temporary file is at the top
// of a namespace directory, so Scan, Clean and Evict never touch it (a
// test checks every layout).
const LeaseName = "~lease"

// LeaseStateSizeMax is the largest state Publish takes, and with the
// holder's line bounds what ReadLease reads.
const LeaseStateSizeMax = 16 << 10

// leaseHolderSizeMax bounds the holder's line.
const leaseHolderSizeMax = 1024

// leaseOpenAttempts bounds how often TryLease reopens a lease file that was
// replaced between its open and its lock.
const leaseOpenAttempts = 8

// ErrLeaseHeld is returned by TryLease when another holds the lease.
var ErrLeaseHeld = errors.New("blockstore: the lease is held by another")

// ErrLeaseLost is returned by Check when the lease is no longer this
// Lease's: the lock was refused or the lease file was replaced.
var ErrLeaseLost = errors.New("blockstore: the lease was lost")

// Lease is a held lease on a directory. Its methods are safe for
// concurrent use; after Close they fail with an error wrapping
// fs.ErrClosed.
type Lease struct {
	path      string // the lease file's path; immutable
	holderLen int    // len(holder)+1: where the state starts in the file and in buf; immutable
	cmd       int    // F_OFD_SETLK, or F_SETLK after the EINVAL fallback; immutable
	dev, ino  uint64 // the locked file's identity; immutable

	// mu guards fd, buf and the file's content: one Publish, Check or
	// Close at a time.
	mu  sync.Mutex
	fd  int    // the locked descriptor; -1 after Close
	buf []byte // the holder's line then the last state published, reused
}

// leaseID is a lease file's identity, for the classic-lock registry.
type leaseID struct{ dev, ino uint64 }

// leaseLockCmd is the lock TryLease tries first: F_OFD_SETLK; tests set
// F_SETLK to exercise the fallback on filesystems that take OFD locks.
var leaseLockCmd = unix.F_OFD_SETLK

// classic registers the Leases held with classic POSIX locks, which the
// kernel does not tell apart within a process. classicMu is held across
// the open and the close of every descriptor this package opens on a lease
// file, so that none closes a descriptor of a file this process holds a
// classic lock on. classicMu comes before a Lease's mu.
var (
	classicMu sync.Mutex
	classic   = map[leaseID]*Lease{}
)

// TryLease takes the lease on dir without waiting, creating the lease file
// if needed, and writes holder (e.g. "host pid 123", one line) as its
// content. If another holds the lease the error wraps ErrLeaseHeld. The
// file is synced, so that ReadLease on another client of a network
// filesystem names the holder.
func TryLease(dir, holder string) (*Lease, error) {
	path := filepath.Join(dir, LeaseName)
	if strings.ContainsRune(holder, '\n') || len(holder) > leaseHolderSizeMax {
		return nil, &fs.PathError{Op: "lease", Path: path,
			Err: fmt.Errorf("%w: the holder must be one line of at most %d bytes", ErrInvalidOptions, leaseHolderSizeMax)}
	}
	classicMu.Lock()
	defer classicMu.Unlock()
	// A file this process holds classically must not even be opened: the
	// close after a failed lock would release the holder's lock.
	if len(classic) > 0 {
		var st unix.Stat_t
		if ignoringEINTR(func() error { return unix.Stat(path, &st) }) == nil && classic[leaseID{st.Dev, st.Ino}] != nil {
			return nil, &fs.PathError{Op: "lease", Path: path, Err: fmt.Errorf("%w (by this process)", ErrLeaseHeld)}
		}
	}
	for range leaseOpenAttempts {
		l, retry, err := tryLeaseOnce(path, holder)
		if !retry {
			return l, err
		}
	}
	return nil, &fs.PathError{Op: "lease", Path: path, Err: fmt.Errorf("%w: the lease file was replaced %d times while being locked", ErrLeaseLost, leaseOpenAttempts)}
}

// tryLeaseOnce opens and locks the lease file; retry says the file was
// replaced after the open (the lock is on an unlinked inode) and the caller
// should open it again. The caller holds classicMu.
func tryLeaseOnce(path, holder string) (l *Lease, retry bool, err error) {
	// O_NOFOLLOW: a symlink planted in a shared directory does not make us
	// lock (or write) a file elsewhere. O_NONBLOCK: a FIFO does not hang us.
	fd, err := openFile(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK, fileMode)
	if err != nil {
		return nil, false, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	fail := func(op string, err error) (*Lease, bool, error) {
		unix.Close(fd)
		return nil, false, &fs.PathError{Op: op, Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return fail("fstat", err)
	}
	if err := CheckRegular(st.Mode); err != nil {
		return fail("lease", err)
	}
	cmd := leaseLockCmd
	err = setLeaseLock(fd, cmd, unix.F_WRLCK)
	if err == unix.EINVAL {
		cmd = unix.F_SETLK
		err = setLeaseLock(fd, cmd, unix.F_WRLCK)
	}
	switch err {
	case nil:
	case unix.EAGAIN, unix.EACCES: // fcntl(2): either means a conflicting lock is held
		return fail("lease", ErrLeaseHeld)
	default:
		return fail("lock", err)
	}
	l = &Lease{path: path, holderLen: len(holder) + 1, cmd: cmd, dev: st.Dev, ino: st.Ino, fd: fd}
	if err := l.sameFile(); err != nil {
		unix.Close(fd) // never a classic lock still registered: it is not registered yet
		if errors.Is(err, ErrLeaseLost) {
			return nil, true, nil
		}
		return nil, false, err
	}
	l.buf = append(append(make([]byte, 0, l.holderLen+256), holder...), '\n')
	if err := l.write(); err != nil {
		unix.Close(fd)
		return nil, false, err
	}
	if cmd == unix.F_SETLK {
		classic[leaseID{st.Dev, st.Ino}] = l
	}
	return l, false, nil
}

// setLeaseLock sets (typ F_WRLCK) or clears (F_UNLCK) a lock on the whole
// file with cmd, F_OFD_SETLK or F_SETLK, without waiting.
func setLeaseLock(fd, cmd int, typ int16) error {
	// Start 0 and Len 0 from SEEK_SET: the whole file, however it grows.
	// Pid must be 0 for an OFD lock (fcntl(2)), or the kernel says EINVAL.
	lk := unix.Flock_t{Type: typ, Whence: unix.SEEK_SET}
	return ignoringEINTR(func() error { return unix.FcntlFlock(uintptr(fd), cmd, &lk) })
}

// sameFile returns an error wrapping ErrLeaseLost unless the lease file's
// path still names the locked inode: one created in place of an unlinked
// or renamed lease file can be locked by another.
func (l *Lease) sameFile() error {
	var st unix.Stat_t
	switch err := ignoringEINTR(func() error { return unix.Lstat(l.path, &st) }); err {
	case nil:
		if st.Dev != l.dev || st.Ino != l.ino {
			return &fs.PathError{Op: "lease", Path: l.path, Err: fmt.Errorf("%w: the path names another file", ErrLeaseLost)}
		}
		return nil
	case unix.ENOENT:
		return &fs.PathError{Op: "lease", Path: l.path, Err: fmt.Errorf("%w: the lease file was removed", ErrLeaseLost)}
	default:
		return &fs.PathError{Op: "lstat", Path: l.path, Err: err}
	}
}

// write writes buf over the file, cuts it to buf's length and syncs it.
// The caller holds mu (or owns l alone).
//
// The fdatasync is what makes the content reach the others on a network
// filesystem: the holder never closes the file, and an NFS client sends
// cached writes at close, at fsync or when writeback gets to them (up to
// dirty_expire_centisecs, 30 s, later); GlusterFS's write-behind holds
// them too (though not past the ftruncate: through GlusterFS's FUSE
// client the other client reads the state at once without the sync, as
// measured; the sync costs about 3 ms there). On NFS it is one WRITE and a
// COMMIT; on a local filesystem,
// where readers see the page cache at once, it costs a journal commit of
// one small file (the benchmark BenchmarkLeasePublish measures it) —
// cheap at the once a second Publish is meant for.
func (l *Lease) write() error {
	if _, err := pwriteFull(l.fd, l.buf, 0); err != nil {
		return &fs.PathError{Op: "write", Path: l.path, Err: err}
	}
	if err := ignoringEINTR(func() error { return unix.Ftruncate(l.fd, int64(len(l.buf))) }); err != nil {
		return &fs.PathError{Op: "truncate", Path: l.path, Err: err}
	}
	if err := ignoringEINTR(func() error { return unix.Fdatasync(l.fd) }); err != nil {
		return &fs.PathError{Op: "fdatasync", Path: l.path, Err: err}
	}
	return nil
}

// pwriteFull writes all of p at off, continuing after short writes.
func pwriteFull(fd int, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pwrite(fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, unix.EIO // pwrite(2) of a non-empty buffer to a regular file never returns 0
		}
		done += n
	}
	return done, nil
}

// Publish replaces the state after the holder's line with state (at most
// LeaseStateSizeMax bytes; a few hundred are meant), so that the others
// read it with ReadLease. It writes in place, truncates and syncs the data
// (see write for why). A reader that reads during a Publish may see a mix
// of the old and the new state; a state that must be whole carries its own
// check (a length, a checksum, or JSON that fails to parse) and the reader
// reads again.
func (l *Lease) Publish(state []byte) error {
	if len(state) > LeaseStateSizeMax {
		return &fs.PathError{Op: "publish", Path: l.path, Err: fmt.Errorf("%w: the state is %d bytes, at most %d", ErrPayloadSize, len(state), LeaseStateSizeMax)}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fd < 0 {
		return &fs.PathError{Op: "publish", Path: l.path, Err: fs.ErrClosed}
	}
	l.buf = append(l.buf[:l.holderLen], state...)
	return l.write()
}

// Check reports whether the lease is still this Lease's, as far as the
// filesystem can tell, with an error wrapping ErrLeaseLost if it is not; a
// maintainer calls it before each round of eviction and stops on any
// error. It re-issues the lock on the Lease's descriptor, which the holder
// may do at no cost to others (the kernel converts a lock to itself), and
// checks that the lease file's path still names the locked file.
//
// What the re-issued lock proves depends on where locks live. Locally the
// kernel holds them and they cannot be lost while the descriptor is open:
// Check succeeds unless the file was removed or replaced. On NFSv4 and
// GlusterFS the lock request goes to the server (a LOCK or an lk fop), so
// Check fails if the server has given the lock to another (EAGAIN, that
// is ErrLeaseLost), and, on NFS, if the client has marked its lock state
// lost after the server expired its lease (EIO since Linux 3.12, with the
// default nfs.recover_lost_locks=0). Check is one round trip, not a
// guarantee for the time after it: a partitioned client learns of the
// loss only at its next request, and between the server's expiry and that
// request two maintainers may run. Bound that window by the work done
// between Checks, and keep eviction safe against a second evictor (the
// tier's is: it reads each victim's times again just before removing it,
// and a block removed twice costs a miss, never wrong data).
//
// On GlusterFS (tested): while the brick is down Check fails with
// ENOTCONN, or EBADFD once the client has noticed (it marks the
// descriptor bad until it reconnects); a restarted brick has forgotten
// every lock, and the lease goes to whoever asks first, the holder's next
// Check (which re-takes the lock, and succeeds) or another's TryLease (and
// the holder's Check then fails with ErrLeaseLost). So a Check that fails
// does not close the Lease: a later Check that succeeds holds the lease
// again, and a maintainer may resume then.
//
// An error from Check that is not about the lock (the lease file removed
// or replaced, an IO error) wraps ErrLeaseLost too: the maintainer stops.
func (l *Lease) Check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fd < 0 {
		return &fs.PathError{Op: "check lease", Path: l.path, Err: fs.ErrClosed}
	}
	switch err := setLeaseLock(l.fd, l.cmd, unix.F_WRLCK); err {
	case nil:
	case unix.EAGAIN, unix.EACCES:
		return &fs.PathError{Op: "check lease", Path: l.path, Err: fmt.Errorf("%w: %w", ErrLeaseLost, ErrLeaseHeld)}
	default:
		return &fs.PathError{Op: "check lease", Path: l.path, Err: fmt.Errorf("%w: %w", ErrLeaseLost, err)}
	}
	err := l.sameFile()
	var pe *fs.PathError
	if err != nil && !errors.Is(err, ErrLeaseLost) && errors.As(err, &pe) {
		pe.Err = fmt.Errorf("%w: %w", ErrLeaseLost, pe.Err) // cannot tell: stop maintaining
	}
	return err
}

// Close releases the lease and closes the file, which stays for the next
// holder. It unlocks before closing: a child between fork and exec holds a
// copy of the descriptor, which would keep an OFD lock until its exec.
func (l *Lease) Close() error {
	if l.cmd == unix.F_SETLK {
		classicMu.Lock() // before mu, as ReadLease takes them
		defer classicMu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fd < 0 {
		return &fs.PathError{Op: "close lease", Path: l.path, Err: fs.ErrClosed}
	}
	if l.cmd == unix.F_SETLK {
		delete(classic, leaseID{l.dev, l.ino})
	}
	uerr := setLeaseLock(l.fd, l.cmd, unix.F_UNLCK)
	cerr := unix.Close(l.fd)
	l.fd = -1
	if uerr != nil {
		return &fs.PathError{Op: "unlock", Path: l.path, Err: uerr}
	}
	if cerr != nil && cerr != unix.EINTR { // close(2): after EINTR the descriptor is closed; never retry
		return &fs.PathError{Op: "close", Path: l.path, Err: cerr}
	}
	return nil
}

// ReadLease reads the lease file of dir: the holder's line (without its
// newline) and the state last published. It opens, reads and closes the
// file, so that NFS's close-to-open consistency shows the latest content
// the holder synced. A FUSE client that caches attributes and content
// (GlusterFS's defaults: attribute-timeout and md-cache 1 s) may show the
// content of up to about a second before, which a test measures; with those
// caches off it shows the latest at once. A missing file is an error wrapping fs.ErrNotExist;
// a file whose holder is still writing its line reads as holder "" and no
// state. ReadLease neither takes nor tests the lock: that the file names
// a holder does not mean the holder lives.
func ReadLease(dir string) (holder string, state []byte, err error) {
	path := filepath.Join(dir, LeaseName)
	classicMu.Lock()
	defer classicMu.Unlock()
	buf := make([]byte, leaseHolderSizeMax+1+LeaseStateSizeMax+1)
	var n int
	var st unix.Stat_t
	if len(classic) > 0 && ignoringEINTR(func() error { return unix.Stat(path, &st) }) == nil && classic[leaseID{st.Dev, st.Ino}] != nil {
		// Read through the holder's descriptor: closing one of ours would
		// release the process's classic lock.
		l := classic[leaseID{st.Dev, st.Ino}]
		l.mu.Lock()
		n, err = preadFull(l.fd, buf, 0)
		l.mu.Unlock()
	} else {
		n, err = readLeaseFile(path, buf)
	}
	if err != nil {
		return "", nil, err
	}
	if n == len(buf) {
		return "", nil, &fs.PathError{Op: "read lease", Path: path, Err: fmt.Errorf("%w: larger than %d bytes", ErrCorrupt, len(buf)-1)}
	}
	h, s, _ := strings.Cut(string(buf[:n]), "\n")
	if s == "" {
		return h, nil, nil
	}
	return h, []byte(s), nil
}

// readLeaseFile opens, reads into buf and closes the lease file at path.
func readLeaseFile(path string, buf []byte) (int, error) {
	fd, err := openFile(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return 0, &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := CheckRegular(st.Mode); err != nil {
		return 0, &fs.PathError{Op: "read lease", Path: path, Err: err}
	}
	n, err := preadFull(fd, buf, 0)
	if err != nil {
		return 0, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return n, nil
}
