package blockstore

import (
	"math/bits"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RunSync executes the phase's steps with plain system calls, linked as
// the kernel links them (see Link), and fills in their results. dir is the
// namespace directory's descriptor. It is the executor of Put and Get and
// of the tier's sync engine; it blocks for as long as the filesystem does.
func (p *Program) RunSync(dir int) {
	p.execute(func(s *Step) int32 { return p.call(dir, s) })
}

// RunSyncWrites is RunSync with the file's writes made by write, given
// the file's descriptor: another executor's (the tier's io_uring engine
// writes on its ring the files that its pool of goroutines opens, closes
// and renames). Before an O_DIRECT write from the file's start, it
// allocates the file's blocks up to the write's end (fallocate): ext4 and
// XFS take most O_DIRECT writes over allocated blocks inside the file's
// size without blocking (IOCB_NOWAIT), and hand one that extends the file
// to a kernel worker (tierbench's 64 KiB stores on io_uring: ext4 handed
// none to a worker, XFS 4%; 2 MiB ones on ext4, half). A filesystem
// without fallocate (EOPNOTSUPP) writes without; any other failure
// (ENOSPC) is the write's.
func (p *Program) RunSyncWrites(dir int, write func(fd int, s *Step) int32) {
	p.execute(func(s *Step) int32 {
		if s.Op != StepWrite && s.Op != StepWritev {
			return p.call(dir, s)
		}
		if p.direct && s.Off == 0 {
			if r := p.allocate(s.Asked()); r < 0 {
				return r
			}
		}
		return write(p.fd, s)
	})
}

// allocate allocates the program's file's first n bytes, retrying EINTR;
// it returns -errno, or 0 (also where the filesystem has no fallocate).
func (p *Program) allocate(n int64) int32 {
	for {
		switch err := unix.Fallocate(p.fd, 0, 0, n); err {
		case nil, unix.EOPNOTSUPP:
			return 0
		case unix.EINTR:
		default:
			return -int32(errnoOf(err))
		}
	}
}

// execute runs the phase's steps in order through call, as linked steps
// run: after a LinkOnSuccess step fails, the rest of its chain gets
// -ECANCELED without running.
func (p *Program) execute(call func(*Step) int32) {
	stop := false
	for k := range p.N {
		s := &p.Steps[k]
		if stop {
			s.Res = -int32(unix.ECANCELED)
		} else {
			s.Res = call(s)
			stop = s.Link == LinkOnSuccess && s.Failed()
		}
		if s.Link == LinkNone {
			stop = false
		}
	}
}

// call makes step s's system call, retrying EINTR, and returns its result
// or -errno.
func (p *Program) call(dir int, s *Step) int32 {
	for {
		r, errno := p.call1(dir, s)
		switch errno {
		case 0:
			return int32(r)
		case unix.EINTR:
			continue
		}
		return -int32(errno)
	}
}

// call1 is one try of call. Each pointer becomes a uintptr inside the
// system call's argument list, as unsafe.Pointer's rule for syscalls asks,
// so that its object stays put for the call.
func (p *Program) call1(dir int, s *Step) (uintptr, syscall.Errno) {
	switch s.Op {
	case StepStatx:
		r, _, e := unix.Syscall6(unix.SYS_STATX, uintptr(dir), uintptr(unsafe.Pointer(s.Path)), unix.AT_STATX_DONT_SYNC|unix.AT_SYMLINK_NOFOLLOW,
			unix.STATX_TYPE|unix.STATX_SIZE, uintptr(unsafe.Pointer(&p.Stx)), 0)
		return r, e
	case StepOpen:
		how := *s.How
		how.Flags |= unix.O_CLOEXEC
		var r uintptr
		e := unix.ENOSYS
		if !noOpenat2.Load() {
			r, _, e = unix.Syscall6(unix.SYS_OPENAT2, uintptr(dir), uintptr(unsafe.Pointer(s.Path)), uintptr(unsafe.Pointer(&how)), unix.SizeofOpenHow, 0, 0)
		}
		if e == unix.ENOSYS {
			// Before Linux 5.6: no RESOLVE_*; at least the last component
			// is not followed.
			noOpenat2.Store(true)
			r, _, e = unix.Syscall6(unix.SYS_OPENAT, uintptr(dir), uintptr(unsafe.Pointer(s.Path)), uintptr(how.Flags|unix.O_NOFOLLOW), uintptr(how.Mode), 0, 0)
		}
		switch {
		case e == 0 && s.Keep:
			return r, 0 // the program keeps it (DirFD)
		case e == 0 && s.Probe:
			unix.Close(int(r))
			return 0, 0
		case e == 0:
			p.fd = int(r)
			return 0, 0
		}
		return r, e
	case StepRead:
		n, err := unix.Pread(p.fd, s.Buf, s.Off)
		return uintptr(n), errnoOf(err)
	case StepReadv:
		return p.vectored(unix.SYS_PREADV, s)
	case StepWrite:
		n, err := unix.Pwrite(p.fd, s.Buf, s.Off)
		return uintptr(n), errnoOf(err)
	case StepWritev:
		return p.vectored(unix.SYS_PWRITEV, s)
	case StepFsync:
		if s.Data {
			return 0, errnoOf(unix.Fdatasync(p.fd))
		}
		return 0, errnoOf(unix.Fsync(p.fd))
	case StepClose:
		if s.Keep {
			return 0, errnoOf(unix.Close(p.DirFD))
		}
		if p.fd < 0 {
			return 0, unix.EBADF
		}
		err := unix.Close(p.fd)
		p.fd = -1 // closed even when close reports an error
		return 0, errnoOf(err)
	case StepMkdir:
		_, _, e := unix.Syscall(unix.SYS_MKDIRAT, uintptr(dir), uintptr(unsafe.Pointer(s.Path)), dirMode)
		return 0, e
	case StepRename:
		from, newDir := s.At(p, dir), s.At(p, dir)
		if s.Abs2 {
			newDir = unix.AT_FDCWD
		}
		_, _, e := unix.Syscall6(unix.SYS_RENAMEAT, uintptr(from), uintptr(unsafe.Pointer(s.Path)), uintptr(newDir), uintptr(unsafe.Pointer(s.Path2)), 0, 0)
		return 0, e
	case StepUnlink:
		_, _, e := unix.Syscall(unix.SYS_UNLINKAT, uintptr(s.At(p, dir)), uintptr(unsafe.Pointer(s.Path)), 0)
		return 0, e
	}
	panic("blockstore: unknown step")
}

// vectored runs preadv or pwritev (trap) of s.Vec at s.Off on the
// program's file, the offset in two halves of a long, as the raw calls
// take it (the high half is 0 on 64-bit systems).
func (p *Program) vectored(trap uintptr, s *Step) (uintptr, syscall.Errno) {
	lo, hi := uintptr(s.Off), uintptr(uint64(s.Off)>>(bits.UintSize/2)>>(bits.UintSize/2))
	r, _, e := unix.Syscall6(trap, uintptr(p.fd), uintptr(unsafe.Pointer(unsafe.SliceData(s.Vec))), uintptr(len(s.Vec)), lo, hi, 0)
	return r, e
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return err.(syscall.Errno)
}
