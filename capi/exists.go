package main

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/tier"
)

// ut_exists runs access(path, F_OK) for many paths on a fixed pool of
// goroutines: the parallel drop-in for a caller's loop of access() calls.
// The pool is shared by all calls and bounds how many threads a hung
// filesystem can hold.
const (
	// existsWorkers is how many paths are looked up at once, and so how
	// many threads a hung filesystem can keep in system calls at most.
	existsWorkers = 64
	// existsChunkMax is the most paths one worker takes at a time: large
	// enough that a warm lookup (~1 µs) is not dwarfed by the hand-over,
	// small enough that a slow filesystem keeps every worker busy.
	existsChunkMax = 16
	// existsQueueSize bounds the chunks waiting for a worker; a call that
	// finds the queue full reports its remaining paths timed out.
	existsQueueSize = 4096
)

// existsCall is one ut_exists call. Workers write only status, which is Go
// memory: after a timeout the caller's array is no longer touched.
type existsCall struct {
	paths    []byte          // the caller's paths, copied; NUL-terminated each
	starts   []int32         // path i starts at paths[starts[i]]
	status   []atomic.Uint32 // tier.Status per path; 0 (pending) until answered
	deadline time.Time
	chunks   atomic.Int32  // chunks not yet finished
	done     chan struct{} // closed when chunks reaches 0
}

type existsChunk struct {
	c      *existsCall
	lo, hi int // paths [lo, hi)
}

var (
	existsOnce  sync.Once
	existsQueue chan existsChunk
)

func existsStart() {
	existsQueue = make(chan existsChunk, existsQueueSize)
	for range existsWorkers {
		go existsWorker()
	}
}

func existsWorker() {
	for ch := range existsQueue {
		c := ch.c
		for i := ch.lo; i < ch.hi && time.Now().Before(c.deadline); i++ {
			c.status[i].Store(uint32(access(&c.paths[c.starts[i]])))
		}
		c.finish()
	}
}

func (c *existsCall) finish() {
	if c.chunks.Add(-1) == 0 {
		close(c.done)
	}
}

// access answers one path as access(path, F_OK) would: found, missing
// (ENOENT, ENOTDIR: what a loop of access() calls would take for "no"),
// or failed.
func access(path *byte) tier.Status {
	fdcwd := unix.AT_FDCWD // a variable: the negative constant does not convert to uintptr
	for {
		_, _, errno := unix.Syscall6(unix.SYS_FACCESSAT, uintptr(fdcwd), uintptr(unsafe.Pointer(path)), unix.F_OK, 0, 0, 0)
		switch errno {
		case 0:
			return tier.StatusFound
		case unix.EINTR:
			continue
		case unix.ENOENT, unix.ENOTDIR:
			return tier.StatusMissing
		}
		return tier.StatusFailed
	}
}

// exists looks up the n NUL-terminated paths in paths, waiting at most
// timeout, writes each one's status into status and returns how many
// exist.
func exists(paths []byte, n int, timeout time.Duration, status []byte) (int, error) {
	if got := bytes.Count(paths, []byte{0}); got != n || (n > 0 && paths[len(paths)-1] != 0) {
		return 0, fmt.Errorf("%w: ut_exists: %d bytes hold %d NUL-terminated paths, n is %d", errArg, len(paths), got, n)
	}
	if n == 0 {
		return 0, nil
	}
	existsOnce.Do(existsStart)
	c := &existsCall{
		paths:    bytes.Clone(paths),
		starts:   make([]int32, n),
		status:   make([]atomic.Uint32, n),
		deadline: time.Now().Add(timeout),
		done:     make(chan struct{}),
	}
	start := 0
	for i := range n {
		c.starts[i] = int32(start)
		start += bytes.IndexByte(c.paths[start:], 0) + 1
	}
	chunk := min(max((n+existsWorkers-1)/existsWorkers, 1), existsChunkMax)
	c.chunks.Store(int32((n + chunk - 1) / chunk))
	for lo := 0; lo < n; lo += chunk {
		select {
		case existsQueue <- existsChunk{c: c, lo: lo, hi: min(lo+chunk, n)}:
		default:
			c.finish() // queue full: its paths stay pending and report timed out
		}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
	}
	found := 0
	for i := range n {
		st := tier.Status(c.status[i].Load())
		if st == tier.StatusPending {
			st = tier.StatusTimedOut
		}
		if st == tier.StatusFound {
			found++
		}
		status[i] = byte(st)
	}
	return found, nil
}
