package main

// #include <stdint.h>
// #include "uringtier.h"
import "C"

import (
	"context"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/uringtier/uringtier/tier"
)

// The functions below are called by shim.c's ut_* functions of the same
// name (documented in uringtier.h) once the fork check has passed. They are
// exported for shim.c only and are not part of the ABI.

//export utgo_open
func utgo_open(dir, options *C.char, mem unsafe.Pointer, memSize, n C.size_t, out *C.ut_tier) C.int {
	if dir == nil || out == nil {
		return fail(fmt.Errorf("%w: ut_open: dir and out must not be NULL", errArg))
	}
	if n > 0 && (mem == nil || !sane(memSize, 1)) || n > math.MaxInt32 {
		return fail(fmt.Errorf("%w: ut_open_buffers: %d buffers in %d bytes at %p", errArg, uint64(n), uint64(memSize), mem))
	}
	var buffers []byte
	if n > 0 {
		buffers = unsafe.Slice((*byte)(mem), memSize)
	}
	h, err := open(C.GoString(dir), C.GoString(options), buffers, int(n)) // GoString(NULL) is ""
	if err != nil {
		return fail(err)
	}
	*out = h
	return C.UT_OK
}

//export utgo_buffers_size
func utgo_buffers_size(blockSize, n C.size_t) C.size_t {
	if blockSize == 0 || blockSize > 1<<40 || n > 1<<20 { // beyond any tier's bounds; no overflow
		return 0
	}
	return C.size_t(tier.BuffersSize(int(blockSize), int(n)))
}

//export utgo_buffers
func utgo_buffers(h C.ut_tier, bufs *unsafe.Pointer, capacity C.size_t) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	if (bufs == nil && capacity > 0) || !sane(capacity, unsafe.Sizeof(*bufs)) {
		return fail(fmt.Errorf("%w: ut_buffers: %d addresses at %p", errArg, uint64(capacity), bufs))
	}
	b := c.t.Buffers()
	if b == nil && c.buffers > 0 {
		return fail(fmt.Errorf("%w: ut_buffers", tier.ErrClosed))
	}
	dst := unsafe.Slice(bufs, capacity)
	for i := range min(len(dst), len(b)) {
		dst[i] = unsafe.Pointer(&b[i][0])
	}
	return C.int(len(b))
}

//export utgo_submit
func utgo_submit(h C.ut_tier, op C.int, prefix C.int, req C.uint64_t, keys unsafe.Pointer, keysSize C.size_t,
	keySizes *C.uint32_t, n C.size_t, bufs *unsafe.Pointer, bufSize C.size_t) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	if err := c.submit(tier.Op(op), prefix != 0, uint64(req), keys, int(keysSize), keySizes, int(n), bufs, int(bufSize)); err != nil {
		return fail(err)
	}
	return C.UT_OK
}

// submit turns the caller's arrays into slices over its memory and submits
// them. Keys are copied by the tier; buffers stay the caller's memory.
func (c *ctier) submit(op tier.Op, prefix bool, req uint64, keys unsafe.Pointer, keysSize int,
	keySizes *C.uint32_t, n int, bufs *unsafe.Pointer, bufSize int) error {
	if n > c.batchMax {
		return fmt.Errorf("%w: %d keys (batch_max is %d)", tier.ErrInvalid, n, c.batchMax)
	}
	if n < 0 || keysSize < 0 || (keys == nil && keysSize > 0) {
		return fmt.Errorf("%w: keys", errArg)
	}
	sp, _ := c.slices.Get().(*[][]byte)
	if sp == nil {
		sp = new([][]byte)
	}
	defer func() {
		clear(*sp) // no reference to the caller's memory outlives the call
		c.slices.Put(sp)
	}()
	all := *sp
	if cap(all) < 2*n {
		all = make([][]byte, 2*n)
		*sp = all
	}
	ks, bs := all[:n:n], all[n:2*n]
	data := unsafe.Slice((*byte)(keys), keysSize)
	if keySizes == nil {
		if n > 0 && keysSize%n != 0 {
			return fmt.Errorf("%w: %d bytes of keys do not split into %d keys of one size", tier.ErrInvalid, keysSize, n)
		}
		for i := range n {
			size := keysSize / n
			ks[i] = data[i*size : (i+1)*size : (i+1)*size]
		}
	} else {
		sizes := unsafe.Slice((*uint32)(unsafe.Pointer(keySizes)), n)
		off := 0
		for i, s := range sizes {
			if int(s) > keysSize-off {
				return fmt.Errorf("%w: key %d ends past the %d bytes of keys", tier.ErrInvalid, i, keysSize)
			}
			ks[i] = data[off : off+int(s) : off+int(s)]
			off += int(s)
		}
		if off != keysSize {
			return fmt.Errorf("%w: key sizes add up to %d, keys_size is %d", tier.ErrInvalid, off, keysSize)
		}
	}
	switch op {
	case tier.OpLookup:
		if prefix {
			return c.t.LookupPrefix(req, ks)
		}
		return c.t.Lookup(req, ks)
	case tier.OpDelete:
		return c.t.Delete(req, ks)
	case tier.OpLoad, tier.OpStore:
		if n > 0 && bufs == nil {
			return fmt.Errorf("%w: bufs is NULL", errArg)
		}
		if n > 0 && bufSize != c.t.BlockSize() {
			return fmt.Errorf("%w: buffers of %d bytes, the block size is %d", tier.ErrInvalid, bufSize, c.t.BlockSize())
		}
		for i, p := range unsafe.Slice(bufs, n) {
			if p == nil {
				return fmt.Errorf("%w: buffer %d is NULL", errArg, i)
			}
			bs[i] = unsafe.Slice((*byte)(p), bufSize)
		}
		if op == tier.OpLoad {
			return c.t.Load(req, ks, bs)
		}
		return c.t.Store(req, ks, bs)
	}
	panic("capi: submit of op " + op.String())
}

//export utgo_poll
func utgo_poll(h C.ut_tier, results *C.ut_result, resultsCap C.size_t, status *C.uint8_t, statusCap C.size_t) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	if (results == nil && resultsCap > 0) || (status == nil && statusCap > 0) {
		return fail(fmt.Errorf("%w: ut_poll: NULL array", errArg))
	}
	if !sane(resultsCap, unsafe.Sizeof(*results)) || !sane(statusCap, 1) {
		return fail(fmt.Errorf("%w: ut_poll: results_cap %d or status_cap %d", errArg, uint64(resultsCap), uint64(statusCap)))
	}
	n, err := c.poll(unsafe.Slice(results, resultsCap), unsafe.Slice((*byte)(status), statusCap))
	if err != nil {
		return fail(err)
	}
	return C.int(n)
}

// poll copies waiting results into dst and their statuses into status. A
// result without room in status is kept in c.carry for the next call, so
// results keep their order and none is lost.
func (c *ctier) poll(dst []C.ut_result, status []byte) (int, error) {
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	c.clearReady()
	n, used := 0, 0
	for n < len(dst) {
		if !c.carried {
			if c.t.Poll(c.one) == 0 {
				break
			}
			c.carry, c.one[0] = c.one[0], c.carry // swap, keeping both Keys capacities
			c.carried = true
		}
		r := &c.carry
		k := len(r.Keys)
		if k > len(status)-used {
			if n == 0 {
				return 0, fmt.Errorf("%w: request %d has %d keys, the status array holds %d", errRange, r.Req, k, len(status))
			}
			break
		}
		for i, kr := range r.Keys {
			status[used+i] = byte(kr.Status)
		}
		dst[n] = C.ut_result{
			req:    C.uint64_t(r.Req),
			op:     C.uint32_t(r.Op),
			keys:   C.uint32_t(k),
			first:  C.uint32_t(used),
			prefix: C.uint32_t(r.Prefix),
			held:   C.uint32_t(r.Held),
		}
		used += k
		n++
		c.carried = false
	}
	return n, nil
}

//export utgo_fd
func utgo_fd(h C.ut_tier) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	return C.int(c.efd)
}

//export utgo_cancel
func utgo_cancel(h C.ut_tier, req C.uint64_t) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	if c.t.Cancel(uint64(req)) {
		return 1
	}
	return 0
}

//export utgo_close
func utgo_close(h C.ut_tier, timeoutMS C.int64_t) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	// Not held while Close waits: ut_free of the handle (which waits for
	// calls in progress) and a second ut_close keep to their own waits.
	t := c.t
	c.mu.RUnlock()
	if timeoutMS < 0 {
		return fail(fmt.Errorf("%w: ut_close: negative timeout %d ms", errArg, int64(timeoutMS)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), millis(timeoutMS))
	defer cancel()
	if err := t.Close(ctx); err != nil {
		return fail(err)
	}
	return C.UT_OK
}

//export utgo_free
func utgo_free(h C.ut_tier) C.int {
	if err := free(h); err != nil {
		return fail(err)
	}
	return C.UT_OK
}

//export utgo_gauges
func utgo_gauges(h C.ut_tier, out *C.ut_gauges) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	if out == nil {
		return fail(fmt.Errorf("%w: ut_read_gauges: NULL out", errArg))
	}
	g := c.t.Gauges()
	*out = C.ut_gauges{
		in_flight: C.uint64_t(g.InFlight), queued: C.uint64_t(g.Queued),
		stuck: C.uint64_t(g.Stuck), held: C.uint64_t(g.Held),
	}
	if g.BreakerOpen {
		out.breaker_open = 1
	}
	return C.UT_OK
}

//export utgo_stats
func utgo_stats(h C.ut_tier, buf *C.char, capacity C.size_t) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	return copyOut(statsJSON(c.t.Namespace(), c.t.Stats()), buf, capacity)
}

//export utgo_engine
func utgo_engine(h C.ut_tier, buf *C.char, capacity C.size_t) C.int {
	c, err := acquire(h)
	if err != nil {
		return fail(err)
	}
	defer c.mu.RUnlock()
	return copyOut(engineJSON(c.t.Engine()), buf, capacity)
}

// copyOut writes b, truncated and NUL-terminated, into the caller's
// buf of capacity bytes and returns len(b), as snprintf does.
func copyOut(b []byte, buf *C.char, capacity C.size_t) C.int {
	if buf == nil && capacity > 0 {
		return fail(fmt.Errorf("%w: NULL buffer", errArg))
	}
	if !sane(capacity, 1) {
		return fail(fmt.Errorf("%w: capacity %d", errArg, uint64(capacity)))
	}
	if capacity > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), capacity)
		n := copy(dst[:len(dst)-1], b)
		dst[n] = 0
	}
	return C.int(len(b))
}

//export utgo_exists
func utgo_exists(paths *C.char, pathsSize C.size_t, n C.size_t, timeoutMS C.int64_t, status *C.uint8_t) C.int {
	if (paths == nil && pathsSize > 0) || (status == nil && n > 0) || timeoutMS < 0 {
		return fail(fmt.Errorf("%w: ut_exists: NULL array or negative timeout", errArg))
	}
	if pathsSize > math.MaxInt32 || n > math.MaxInt32 {
		// Path offsets are int32, and the count found is returned as an int.
		return fail(fmt.Errorf("%w: ut_exists: %d paths in %d bytes (at most 2^31-1 of either)", errArg, uint64(n), uint64(pathsSize)))
	}
	found, err := exists(unsafe.Slice((*byte)(unsafe.Pointer(paths)), pathsSize), int(n),
		millis(timeoutMS), unsafe.Slice((*byte)(status), n))
	if err != nil {
		return fail(err)
	}
	return C.int(found)
}

// millis converts a timeout in milliseconds, saturating: a timeout longer
// than a Duration holds (292 years) waits as long as it takes, where the
// product would wrap to an expired deadline.
func millis(ms C.int64_t) time.Duration {
	if int64(ms) > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// sane reports whether n elements of size bytes can be a C array in this
// process (at most 2^48 bytes, beyond any address space it has), so that
// unsafe.Slice, which panics where the length does not fit, never sees one
// that does not: an impossible length is UT_EARG, not a crash.
func sane(n C.size_t, size uintptr) bool {
	return uint64(n) <= 1<<48/uint64(size)
}
