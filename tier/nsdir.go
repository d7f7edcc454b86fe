package tier

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/uringtier/uringtier/blockstore"
	"golang.org/x/sys/unix"
)

// nsCheckInterval is how often a backend checks that its namespace
// directory fd is still the directory at the namespace's path.
const nsCheckInterval = time.Second

// nsDirFD is the tier's open namespace directory, shared by its backends
// (every ring sees a replacement at once: a load may go to any ring): the
// dirfd their *at calls resolve block paths beneath. When the directory at the namespace's path
// is no longer the one open (an operator removed it; another process
// recreated it), a new fd replaces it: renew does that when a store cannot
// create beneath the fd, and a check at most once a second when someone
// else made a new directory.
//
// An op in flight may still use a replaced fd: a sync worker or an
// io_uring worker resolves it when the op runs, after reading it. So a
// replaced fd stays open until the backend closes, lest its number be
// reused by another file while an op resolves paths against it: one fd per
// replacement, and replacements happen only when the directory itself is
// removed or replaced.
type nsDirFD struct {
	t       *Tier        // immutable
	epoch   time.Time    // immutable; checkAt counts from it
	fd      atomic.Int32 // the current dirfd: read by anyone, replaced under mu
	checkAt atomic.Int64 // nanoseconds after epoch when the next check is due
	closed  atomic.Bool  // set by close, under mu: replace nothing more
	users   atomic.Int32 // backends that have not released it
	keep    atomic.Bool  // a backend's kernel may still resolve paths against the fds: never close them

	kick     chan struct{} // asks the checker goroutine for a check; closed by stop
	stopOnce sync.Once

	mu      sync.Mutex // serialises replacements; guards retired
	retired []int      // replaced fds, closed by close
}

// openNSDirFD opens the namespace directory for users backends, each of
// which calls release once.
func openNSDirFD(t *Tier, users int) (*nsDirFD, error) {
	fd, err := openDir(t.nsDir)
	if err != nil {
		return nil, fmt.Errorf("tier: open %s: %w", t.nsDir, err)
	}
	d := &nsDirFD{t: t, epoch: time.Now(), kick: make(chan struct{}, 1)}
	d.users.Store(int32(users))
	d.fd.Store(int32(fd))
	d.checkAt.Store(int64(nsCheckInterval))
	go d.checker()
	return d, nil
}

func openDir(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// currentAt returns the dirfd to use at t, the time its caller started
// the op (a clock read per key was 1.3% of a warm-lookup benchmark's CPU
// profile on a ring owner, BenchmarkLookup, O_PATH, a ring per CPU, and
// 3-4% of a sync worker's). At most once a second it also asks for a
// check, which the checker goroutine makes: the caller may be a ring
// owner, which must not wait for the filesystem (nor allocate a goroutine
// per check). Safe from any goroutine until close.
func (d *nsDirFD) currentAt(t time.Time) int {
	now := int64(t.Sub(d.epoch))
	if at := d.checkAt.Load(); now >= at && d.checkAt.CompareAndSwap(at, now+int64(nsCheckInterval)) {
		select {
		case d.kick <- struct{}{}:
		default: // a check is pending already
		}
	}
	return int(d.fd.Load())
}

// stop ends the checker, leaving the fds open: for a backend whose kernel
// operations may still resolve paths against them. Nothing may call
// currentAt afterwards.
func (d *nsDirFD) stop() { d.stopOnce.Do(func() { close(d.kick) }) }

// checker makes the checks currentAt asks for, until stop.
func (d *nsDirFD) checker() {
	for range d.kick {
		d.check()
	}
}

// check replaces the fd if another directory is at the namespace's path.
// A directory that has gone and not come back is left to renew.
func (d *nsDirFD) check() {
	fd := int(d.fd.Load())
	if d.closed.Load() || !d.stale(fd) {
		return
	}
	if nfd, err := openDir(d.t.nsDir); err == nil {
		d.mu.Lock()
		d.replace(fd, nfd)
		d.mu.Unlock()
	}
}

// renew is called by a store that could not create beneath fd (ENOENT).
// If fd's directory is not the one at the namespace's path, it creates the
// namespace directory again (with the root, and the quarantine directory,
// which goes with the root) and replaces fd. It returns the fd to retry
// with: fd itself when fd is still right (something below it went missing)
// or nothing could be done. It makes a few directory calls in the caller's
// thread, a ring owner's too: only after the filesystem has just answered
// for this directory.
func (d *nsDirFD) renew(fd int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := int(d.fd.Load()); cur != fd || d.closed.Load() {
		return cur // replaced meanwhile
	}
	if !d.stale(fd) {
		return fd
	}
	if _, err := d.t.store.NamespaceDir(d.t.opts.Namespace); err != nil {
		return fd // the retry fails and reports why
	}
	if d.t.quarantines() {
		_ = blockstore.MkdirAll(d.t.qDir) // best effort: without it, corrupt blocks stay in place
	}
	nfd, err := openDir(d.t.nsDir)
	if err != nil {
		return fd
	}
	d.replace(fd, nfd)
	return nfd
}

// stale reports whether the directory open as fd is no longer the one at
// the namespace's path: removed (no links left), moved away, or replaced.
func (d *nsDirFD) stale(fd int) bool {
	var open, named unix.Stat_t
	if unix.Fstat(fd, &open) != nil || open.Nlink == 0 {
		return true
	}
	if err := unix.Stat(d.t.nsDir, &named); err != nil {
		return err == unix.ENOENT
	}
	return open.Dev != named.Dev || open.Ino != named.Ino
}

// replace makes nfd the current fd in place of old, unless old has been
// replaced already or d is closed: then nfd is closed. The caller holds mu.
func (d *nsDirFD) replace(old, nfd int) {
	if d.closed.Load() || int(d.fd.Load()) != old {
		unix.Close(nfd)
		return
	}
	d.fd.Store(int32(nfd))
	d.retired = append(d.retired, old)
}

// release is a backend's last use: once no op of its own can use the fds
// and it calls currentAt no more. keep says that its kernel may still
// resolve paths against them (a broken ring): they then stay open. The
// last release ends the checker and closes the fds unless one kept them.
func (d *nsDirFD) release(keep bool) {
	if keep {
		d.keep.Store(true)
	}
	if d.users.Add(-1) > 0 {
		return
	}
	if d.keep.Load() {
		d.stop()
		return
	}
	d.close()
}

// close closes the fd and every replaced one, and ends the checker. A
// check still running closes what it opens.
func (d *nsDirFD) close() {
	d.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed.Store(true)
	unix.Close(int(d.fd.Load()))
	for _, fd := range d.retired {
		unix.Close(fd)
	}
	d.retired = nil
}
