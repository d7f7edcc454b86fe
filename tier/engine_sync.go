package tier

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
	"golang.org/x/sys/unix"
)

// syncBackend runs key operations as plain system calls on a fixed pool of
// goroutines. A worker stuck in a hung filesystem stays stuck; the pool's
// size bounds how many can be, and the shard's deadlines and breaker treat
// them as the io_uring engine's stuck operations.
type syncBackend struct {
	t     *Tier
	ops   []op       // the shard's ops; a worker owns ops[i] between work and done
	work  chan int32 // ops to run; capacity OpsMax, so start never blocks
	done  chan int32 // finished ops; capacity OpsMax, so a worker never blocks
	wakeC chan struct{}
	timer *time.Timer // owner-only
	ns    *nsDirFD    // the namespace directory, for *at calls; workers read its fd concurrently
	wg    sync.WaitGroup
}

func newSyncBackend(t *Tier) (*syncBackend, error) {
	ns, err := openNSDirFD(t)
	if err != nil {
		return nil, err
	}
	return &syncBackend{
		t:     t,
		work:  make(chan int32, t.opts.OpsMax),
		done:  make(chan int32, t.opts.OpsMax),
		wakeC: make(chan struct{}, 1),
		timer: time.NewTimer(time.Hour),
		ns:    ns,
	}, nil
}

// run is the sync engine's owner goroutine.
func (s *shard) run() {
	b := s.be.(*syncBackend)
	b.ops = s.ops
	for range s.t.opts.SyncWorkers {
		b.wg.Add(1)
		go b.worker()
	}
	s.loop()
}

func (b *syncBackend) start(i int32, o *op) { b.work <- i }

func (b *syncBackend) cancel(i int32, o *op) {} // a blocked system call cannot be canceled

func (b *syncBackend) wake() {
	select {
	case b.wakeC <- struct{}{}:
	default:
	}
}

func (b *syncBackend) wait(d time.Duration, done []int32) []int32 {
	select {
	case i := <-b.done:
		done = append(done, i)
	default:
		b.timer.Reset(d)
		select {
		case i := <-b.done:
			done = append(done, i)
		case <-b.wakeC:
		case <-b.timer.C:
		}
		b.timer.Stop()
	}
	for {
		select {
		case i := <-b.done:
			done = append(done, i)
		default:
			return done
		}
	}
}

func (b *syncBackend) close() {
	close(b.work)
	b.wg.Wait()
	b.ns.close()
}

func (b *syncBackend) worker() {
	defer b.wg.Done()
	path := make([]byte, 0, 256)
	hdr := make([]byte, blockstore.HeaderSize)
	for i := range b.work {
		o := &b.ops[i]
		dirFD := b.ns.current() // one directory for the whole op
		path = append(b.t.store.Layout().AppendPath(path[:0], o.keyBytes()), 0)
		switch o.kind {
		case OpLookup:
			o.status, o.err = b.lookup(dirFD, path)
		case OpLoad:
			o.status, o.err = b.load(dirFD, path, hdr, o)
		case OpStore:
			o.status, o.err = b.store(dirFD, o)
		}
		b.done <- i
	}
}

func (b *syncBackend) lookup(dirFD int, path []byte) (Status, error) {
	// statx(2) on the NUL-terminated path directly: unix.Statx would
	// allocate a copy of the path on every call.
	var st unix.Statx_t
	errno := retryEINTR(func() syscall.Errno {
		_, _, e := unix.Syscall6(unix.SYS_STATX, uintptr(dirFD), uintptr(unsafe.Pointer(&path[0])),
			unix.AT_STATX_DONT_SYNC|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_SIZE, uintptr(unsafe.Pointer(&st)), 0)
		return e
	})
	switch errno {
	case 0:
		if blockstore.CheckRegular(uint32(st.Mode)) != nil {
			return StatusMissing, nil // a hint only: the load judges what is there
		}
		return StatusFound, nil
	case unix.ENOENT:
		return StatusMissing, nil
	}
	return StatusFailed, b.t.pathError("statx", path, errno)
}

// load opens the block file beneath the namespace directory, following no
// symlink (a link planted in a shared tree could lead to another tenant's
// file) and without waiting (O_NONBLOCK: a FIFO's open would wait for a
// writer, for good); anything but a regular file there is corrupt.
func (b *syncBackend) load(dirFD int, path, hdr []byte, o *op) (Status, error) {
	fd, err := blockstore.OpenBeneath(dirFD, path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_NOCTTY, 0)
	switch err {
	case nil:
	case unix.ENOENT:
		return StatusMissing, nil
	case unix.ELOOP:
		// Left in place, as the io_uring engine leaves it: a rename
		// cannot tell a link at the block's path from one on the way.
		return StatusCorrupt, fmt.Errorf("%w: symlink at block path", blockstore.ErrCorrupt)
	default:
		return StatusFailed, b.t.pathError("open", path, err.(syscall.Errno))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return StatusFailed, b.t.pathError("fstat", path, err.(syscall.Errno))
	}
	if err := blockstore.CheckRegular(st.Mode); err != nil {
		b.quarantine(dirFD, path, o.keyBytes())
		return StatusCorrupt, err
	}
	hdrN, err := preadFull(fd, hdr, 0)
	if err != nil {
		return StatusFailed, b.t.pathError("read", path, err.(syscall.Errno))
	}
	payN := 0
	if hdrN == len(hdr) && st.Size == int64(len(hdr)+len(o.buf)) {
		if payN, err = preadFull(fd, o.buf, int64(len(hdr))); err != nil {
			return StatusFailed, b.t.pathError("read", path, err.(syscall.Errno))
		}
	}
	status, quarantine, err := loadOutcome(o.keyBytes(), hdr[:hdrN], o.buf[:payN], st.Size, len(o.buf))
	if quarantine {
		b.quarantine(dirFD, path, o.keyBytes())
	}
	return status, err
}

// quarantine moves the entry at path (NUL-terminated, beneath dirFD) into
// the quarantine directory: the entry itself, renamed relative to its
// directory, opened beneath dirFD without following symlinks. A link in
// place of a directory on the way leads elsewhere, and what is there is
// not the tier's to move: it stays.
func (b *syncBackend) quarantine(dirFD int, path, key []byte) {
	rel := trimNUL(path)
	parent, name := dirFD, rel
	if k := bytes.LastIndexByte(rel, '/'); k >= 0 {
		fd, err := blockstore.OpenBeneath(dirFD, append(rel[:k:k], 0), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		parent, name = fd, rel[k+1:]
	}
	q := b.t.quarantinePath(nil, key)
	_ = unix.Renameat(parent, string(name), unix.AT_FDCWD, string(trimNUL(q)))
}

func (b *syncBackend) store(dirFD int, o *op) (Status, error) {
	err := b.t.store.PutAt(dirFD, b.t.opts.Namespace, o.keyBytes(), o.buf)
	if errors.Is(err, fs.ErrNotExist) {
		// The namespace directory itself may have gone (PutAt has made
		// a new one at its path): retry in that one.
		if fd := b.ns.renew(dirFD); fd != dirFD {
			err = b.t.store.PutAt(fd, b.t.opts.Namespace, o.keyBytes(), o.buf)
		}
	}
	if err == nil {
		return StatusStored, nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return StatusFailed, err
	}
	return StatusFailed, &fs.PathError{Op: "store", Path: b.t.nsDir, Err: err}
}

// preadFull reads until buf is full or the file ends.
func preadFull(fd int, buf []byte, off int64) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := unix.Pread(fd, buf[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			break
		}
		n += k
	}
	return n, nil
}

func retryEINTR(f func() syscall.Errno) syscall.Errno {
	for {
		if e := f(); e != unix.EINTR {
			return e
		}
	}
}
