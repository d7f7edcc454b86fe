package main

// #include "uringtier.h"
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/tier"
)

// ctier is a tier as the C side knows it: the Go tier, its eventfd, and
// scratch memory for the conversions.
type ctier struct {
	t        *tier.Tier
	batchMax int           // the tier's BatchMax, checked before reading the caller's arrays; immutable
	buffers  int           // buffers in the caller's memory (ut_open_buffers); immutable
	efd      int           // readable when results wait; closed by free
	stop     chan struct{} // closed by free: ends notify
	stopped  chan struct{} // closed when notify has returned

	// mu lets free wait for calls in progress on this handle, so none
	// uses the eventfd after it is closed (its number could be reused).
	mu    sync.RWMutex
	freed bool // guarded by mu

	pollMu  sync.Mutex    // serializes poll: the fields below
	one     []tier.Result // Poll's destination, len 1
	carry   tier.Result   // a polled result the caller's arrays had no room for
	carried bool          // carry holds a result

	slices sync.Pool // *[][]byte: key and buffer slices for one submit
}

var (
	handles    sync.Map      // ut_tier -> *ctier, for tiers not yet freed
	handleLast atomic.Uint64 // the last handle given out; handles are never reused
)

// open opens a tier and registers it under a new handle.
func open(dir, options string, buffers []byte, n int) (C.ut_tier, error) {
	o, err := parseOptions(options)
	if err != nil {
		return 0, err
	}
	opts, err := o.tierOptions(dir)
	if err != nil {
		return 0, err
	}
	opts.Buffers, opts.BufferMemory = n, buffers
	t, err := tier.Open(dir, opts)
	if err != nil {
		return 0, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		t.Close(ctx)
		return 0, fmt.Errorf("uringtier: eventfd: %w", err)
	}
	batchMax := opts.BatchMax
	if batchMax == 0 {
		batchMax = 4096 // tier.Options' default
	}
	c := &ctier{
		t:        t,
		batchMax: batchMax,
		buffers:  n,
		efd:      efd,
		stop:     make(chan struct{}),
		stopped:  make(chan struct{}),
		one:      make([]tier.Result, 1),
	}
	go c.notify()
	h := handleLast.Add(1)
	handles.Store(h, c)
	return C.ut_tier(h), nil
}

// acquire returns the tier of handle h, read-locked against free; the
// caller calls c.mu.RUnlock when done.
func acquire(h C.ut_tier) (*ctier, error) {
	v, ok := handles.Load(uint64(h))
	if !ok {
		return nil, fmt.Errorf("%w: %d", errHandle, uint64(h))
	}
	c := v.(*ctier)
	c.mu.RLock()
	if c.freed {
		c.mu.RUnlock()
		return nil, fmt.Errorf("%w: %d", errHandle, uint64(h))
	}
	return c, nil
}

// notify turns the tier's Ready signals into eventfd writes until free.
// Ready holds one token and Poll re-signals while results remain, so a
// result is never left without a write after it.
func (c *ctier) notify() {
	defer close(c.stopped)
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0} // the eventfd counter increment, native (little-endian) uint64
	for {
		select {
		case <-c.t.Ready():
			// Cannot fail: the descriptor stays open until stopped is
			// closed, and the counter is reset by every poll.
			unix.Write(c.efd, one)
		case <-c.stop:
			return
		}
	}
}

// clearReady resets the eventfd's counter; the caller then polls, so a
// result published after the reset writes the eventfd again.
func (c *ctier) clearReady() {
	var buf [8]byte
	unix.Read(c.efd, buf[:]) // EAGAIN when already clear: nothing to do
}

// free closes the tier if needed, without waiting for the filesystem,
// stops notify, closes the eventfd and forgets the handle.
func free(h C.ut_tier) error {
	v, ok := handles.LoadAndDelete(uint64(h))
	if !ok {
		return fmt.Errorf("%w: %d", errHandle, uint64(h))
	}
	c := v.(*ctier)
	c.mu.Lock() // waits for calls in progress
	c.freed = true
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.t.Close(ctx) // returns the first Close's result if closed already; stuck operations are reported in Results
	close(c.stop)
	<-c.stopped
	unix.Close(c.efd)
	return nil
}
