package tier

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/uring"
	"golang.org/x/sys/unix"
)

// The io_uring engine. Each shard's owner goroutine is locked to its OS
// thread, creates its ring there (SINGLE_ISSUER, DEFER_TASKRUN) and is the
// only one to touch it. A key operation is a short program of linked SQEs
// run in phases; its user_data is op index << 8 | step.
//
//   lookup (STATX, the default): STATX
//   lookup (O_PATH): OPENAT(O_PATH) into slot i ─link─ CLOSE slot i
//   lookup (mixed): even ops O_PATH, odd ops STATX
//   load:   OPENAT into slot i ─link─ READ_FIXED header ─hardlink─ READ payload ─hardlink─ CLOSE
//           then, for a corrupt block: RENAMEAT into the quarantine
//   store:  [MKDIRAT ─hardlink─ ...] OPENAT(O_CREAT|O_EXCL) tmp into slot i ─link─ WRITE_FIXED header
//           ─link─ WRITE payload [─link─ FSYNC] ─link─ RENAMEAT tmp → final ─hardlink─ CLOSE
//           then on failure: [CLOSE slot i] UNLINKAT tmp; for DurabilityFull: OPENAT dir ─link─ FSYNC ─hardlink─ CLOSE
//
// Hard links make the CLOSE run whatever the read or rename returned (a
// short read breaks an ordinary link); only a failed OPENAT cancels it, and
// then the slot is empty. A store's RENAMEAT runs only if every write
// succeeded, so a partial block is never published.

const (
	wakeUD   = ^uint64(0)
	cancelUD = 1 << 62 // user_data of ASYNC_CANCEL SQEs; their CQEs are ignored
	stepsMax = 10
)

type phase uint8

const (
	phaseMain phase = iota
	phaseQuarantine
	phaseCleanup
	phaseDirSync
	phaseResume // a store's writes went short: write the rest, then publish
	phaseClose  // the op is decided but its slot is still open: close it
)

type stepKind uint8

const (
	stepMkdir stepKind = iota
	stepOpen
	stepRead
	stepWriteHeader
	stepWritePayload
	stepFsync
	stepRename
	stepUnlink
	stepClose
	stepStatx
)

var stepOps = [...]string{"mkdirat", "openat", "read", "write", "write", "fsync", "renameat", "unlinkat", "close", "statx"}

// opMem is the memory of op i that the kernel reads or writes.
type opMem struct {
	path [256]byte // final path, NUL-terminated, relative to the namespace directory
	tmp  [256]byte // temporary path of a store
	dirs [256]byte // MKDIRAT paths, each NUL-terminated; the directory to fsync
	stx  unix.Statx_t
}

// opState tracks op i's current phase. Owner-only.
type opState struct {
	phase    phase
	steps    uint8
	pending  uint8
	kinds    [stepsMax]stepKind
	res      [stepsMax]int32
	slotOpen bool   // the op's fixed-file slot holds a file
	created  bool   // a store made directories, whose parents need a sync too (DurabilityFull)
	retried  bool   // a store already re-created its directories once
	resumes  uint8  // short-write resumptions so far
	hdrDone  int32  // header bytes a store has written
	payDone  int32  // payload bytes a store has written
	cause    error  // a store's failure, kept through the cleanup phase
	qpath    []byte // quarantine path, NUL-terminated
}

type uringBackend struct {
	t      *Tier
	s      *shard
	ring   *uring.Ring
	waker  *uring.Waker
	nsFD   int
	ns     *nsDirFD // owns nsFD, and replaces it when the directory goes (nsdir.go)
	direct bool
	rw     uint8   // SQE flags for reads and writes: SQEAsync where the filesystem may block inline
	om     []opMem // pinned; referenced by SQEs until their CQEs
	pinner runtime.Pinner
	hdrs   []byte // OpsMax header buffers, mmap'd (aligned); registered buffer 0
	st     []opState
	cqes   []uring.CQE
	next   []int32 // ops whose next phase is to be prepared
	doneQ  []int32 // finished ops not yet handed to the shard
	dirs   map[string]struct{}
	dirKey []byte
}

// leaked keeps backends whose ring was closed with operations still in the
// kernel: their memory must outlive any late completion.
var leaked struct {
	sync.Mutex
	backends []*uringBackend
}

// runURing is an io_uring shard's owner goroutine.
func (s *shard) runURing(errs chan<- error) {
	runtime.LockOSThread() // for the ring's life; the thread exits with the goroutine
	b, err := newURingBackend(s.t, s)
	if err != nil {
		close(s.exited)
		errs <- err
		return
	}
	s.be = b
	errs <- nil
	s.loop()
}

func newURingBackend(t *Tier, s *shard) (_ *uringBackend, err error) {
	n := t.opts.OpsMax
	// Room for a lookup batch's two SQEs per key without flushing mid-way.
	entries := uint32(min(8192, max(64, 4*n)))
	b := &uringBackend{t: t, s: s, nsFD: -1, direct: t.engine.Direct,
		om: make([]opMem, n), st: make([]opState, n), cqes: make([]uring.CQE, 256),
		dirs: make(map[string]struct{})}
	if !t.engine.Inline {
		b.rw = uring.SQEAsync
	}
	b.pinner.Pin(&b.om[0])
	defer func() {
		if err != nil {
			b.close(false)
		}
	}()
	if b.ring, err = uring.New(entries, uring.Options{CQEntries: 8 * entries}); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if _, _, err = b.ring.SetIOWQMaxWorkers(uint32(t.opts.WorkersMax), uint32(t.opts.WorkersMax)); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if err = b.ring.RegisterFilesSparse(uint32(n)); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if b.hdrs, err = uring.AllocBuffer(n * blockstore.HeaderSize); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if err = b.ring.RegisterBuffers(append([][]byte{b.hdrs}, t.buffers...)); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if b.ns, err = openNSDirFD(t); err != nil {
		return nil, err
	}
	if b.waker, err = uring.NewWaker(); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	b.waker.Arm(b.sqe(), wakeUD)
	return b, nil
}

// sqe returns a free SQE, submitting what is queued when the SQ is full.
func (b *uringBackend) sqe() *uring.SQE {
	for {
		if s := b.ring.GetSQE(); s != nil {
			return s
		}
		b.submit()
	}
}

// submit hands the queued SQEs to the kernel. When the kernel is busy it
// reaps completions (and keeps their outcomes for the next wait) first.
func (b *uringBackend) submit() {
	for {
		_, err := b.ring.Submit()
		if err == nil {
			return
		}
		if !errors.Is(err, uring.ErrRetry) {
			panic("tier: io_uring submit: " + err.Error()) // a broken ring: nothing sane to do
		}
		b.reap()
	}
}

// ud is the user_data of op i's step.
func ud(i int32, step int) uint64 { return uint64(i)<<8 | uint64(step) }

func (b *uringBackend) hdr(i int32) []byte {
	off := int(i) * blockstore.HeaderSize
	return b.hdrs[off : off+blockstore.HeaderSize : off+blockstore.HeaderSize]
}

// bufIndex returns the registered buffer index of buf when it lies within
// one of the tier's buffers (index 0 is the header buffers), or -1.
func (b *uringBackend) bufIndex(buf []byte) int {
	mem := b.t.bufMem
	if len(mem) == 0 || len(buf) == 0 {
		return -1
	}
	base := uintptr(unsafe.Pointer(&mem[0]))
	p := uintptr(unsafe.Pointer(&buf[0]))
	if p < base || p+uintptr(len(buf)) > base+uintptr(len(mem)) {
		return -1
	}
	k := int(p-base) / b.t.bufStride
	if p+uintptr(len(buf)) > base+uintptr((k+1)*b.t.bufStride) {
		return -1 // spans two buffers
	}
	return k + 1
}

// add prepares step kind k of op i, in order.
func (b *uringBackend) add(i int32, k stepKind, flags uint8) *uring.SQE {
	st := &b.st[i]
	if st.steps == stepsMax {
		panic("tier: an op's phase needs more than stepsMax SQEs (a layout with deeper directories?)")
	}
	s := b.sqe()
	s.UserData = ud(i, int(st.steps))
	s.Flags |= flags
	st.kinds[st.steps] = k
	st.res[st.steps] = 0
	st.steps++
	st.pending++
	return s
}

func (b *uringBackend) start(i int32, o *op) {
	b.nsFD = b.ns.current()
	b.st[i] = opState{qpath: b.st[i].qpath[:0]}
	m := &b.om[i]
	path := append(b.t.store.Layout().AppendPath(m.path[:0], o.keyBytes()), 0)
	if len(path) > len(m.path) {
		panic("tier: block path longer than 255 bytes")
	}
	b.prepare(i, o)
}

// prepare queues the SQEs of op i's current phase.
func (b *uringBackend) prepare(i int32, o *op) {
	st := &b.st[i]
	st.steps, st.pending = 0, 0
	m := &b.om[i]
	slot := uint32(i)
	switch {
	case o.kind == OpLookup && (b.t.opts.Lookup == LookupStatx || b.t.opts.Lookup == LookupMixed && i%2 == 1):
		b.add(i, stepStatx, 0).PrepareStatx(b.nsFD, &m.path[0], unix.AT_STATX_DONT_SYNC, unix.STATX_SIZE, &m.stx)
	case o.kind == OpLookup:
		b.add(i, stepOpen, uring.SQEIOLink).PrepareOpenatDirect(b.nsFD, &m.path[0], unix.O_PATH, 0, slot)
		b.add(i, stepClose, 0).PrepareCloseDirect(slot)
	case o.kind == OpLoad && st.phase == phaseMain:
		flags := unix.O_RDONLY
		if b.direct && aligned(o.buf) {
			flags |= unix.O_DIRECT
		}
		// An O_RDONLY open calls the filesystem's open (FUSE_OPEN, an NFSv4
		// OPEN), which may block like a read: it goes async with them.
		b.add(i, stepOpen, uring.SQEIOLink|b.rw).PrepareOpenatDirect(b.nsFD, &m.path[0], flags, 0, slot)
		rw := uring.SQEIOHardlink | uring.SQEFixedFile | b.rw
		b.add(i, stepRead, rw).PrepareReadFixed(int(slot), b.hdr(i), 0, 0)
		if k := b.bufIndex(o.buf); k > 0 {
			b.add(i, stepRead, rw).PrepareReadFixed(int(slot), o.buf, blockstore.HeaderSize, uint16(k))
		} else {
			b.add(i, stepRead, rw).PrepareRead(int(slot), o.buf, blockstore.HeaderSize)
		}
		b.add(i, stepClose, 0).PrepareCloseDirect(slot)
	case o.kind == OpLoad && st.phase == phaseQuarantine:
		b.add(i, stepRename, 0).PrepareRenameat(b.nsFD, &m.path[0], unix.AT_FDCWD, &st.qpath[0], 0)
	case o.kind == OpStore && st.phase == phaseMain:
		b.prepareStore(i, o)
	case o.kind == OpStore && st.phase == phaseResume:
		b.prepareStoreTail(i, o)
	case st.phase == phaseClose:
		b.add(i, stepClose, 0).PrepareCloseDirect(slot)
	case o.kind == OpStore && st.phase == phaseCleanup:
		b.add(i, stepUnlink, 0).PrepareUnlinkat(b.nsFD, &m.tmp[0], 0)
	case o.kind == OpStore && st.phase == phaseDirSync:
		// The block's directory holds the new name; when the store
		// created directories, each parent holds a new name too.
		dirs := append(b.t.store.Layout().AppendDir(m.dirs[:0], o.keyBytes()), 0)
		if st.created {
			for k := len(dirs) - 2; k > 0; k-- {
				if dirs[k] == '/' {
					dirs = append(append(dirs, dirs[:k]...), 0)
				}
			}
			dirs = append(dirs, '.', 0)
		}
		// One chain: OPENAT ─link─ FSYNC ─hardlink─ CLOSE ─link─ the next
		// directory's OPENAT. The last CLOSE must not link: the SQE after
		// it belongs to another op.
		var last *uring.SQE
		for start := 0; start < len(dirs); start += bytes.IndexByte(dirs[start:], 0) + 1 {
			b.add(i, stepOpen, uring.SQEIOLink|b.rw).PrepareOpenatDirect(b.nsFD, &m.dirs[start], unix.O_RDONLY|unix.O_DIRECTORY, 0, slot)
			b.add(i, stepFsync, uring.SQEIOHardlink|uring.SQEFixedFile).PrepareFsync(int(slot), false)
			last = b.add(i, stepClose, uring.SQEIOLink)
			last.PrepareCloseDirect(slot)
		}
		last.Flags &^= uring.SQEIOLink
	default:
		panic(fmt.Sprintf("tier: no phase %d for %v", st.phase, o.kind))
	}
}

func (b *uringBackend) prepareStore(i int32, o *op) {
	m, slot := &b.om[i], uint32(i)
	key := o.keyBytes()
	layout := b.t.store.Layout()
	tmp := append(layout.AppendTempPath(m.tmp[:0], key, blockstore.NewTempToken()), 0)
	b.dirKey = append(layout.AppendDir(b.dirKey[:0], key), 0)
	dir := b.dirKey
	if len(tmp) > len(m.tmp) || len(dir)*2 > len(m.dirs) {
		panic("tier: block path longer than the op's path buffers")
	}
	if _, known := b.dirs[string(dir)]; !known {
		// Each parent of the directory, then the directory: "aa\0aa/bb\0".
		d := m.dirs[:0]
		for k := range len(dir) - 1 {
			if dir[k] == '/' {
				start := len(d)
				d = append(d, dir[:k]...)
				d = append(d, 0)
				b.add(i, stepMkdir, uring.SQEIOHardlink).PrepareMkdirat(b.nsFD, &d[start], 0o755)
			}
		}
		start := len(d)
		d = append(d, dir...)
		b.add(i, stepMkdir, uring.SQEIOHardlink).PrepareMkdirat(b.nsFD, &d[start], 0o755)
	}
	blockstore.EncodeHeader(b.hdr(i), key, o.buf)
	b.add(i, stepOpen, uring.SQEIOLink|b.rw).PrepareOpenatDirect(b.nsFD, &m.tmp[0], unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644, slot)
	b.prepareStoreTail(i, o)
}

// prepareStoreTail queues what a store does once its temporary file is
// open: write what is left of the header and payload, sync, publish, close.
func (b *uringBackend) prepareStoreTail(i int32, o *op) {
	st, m, slot := &b.st[i], &b.om[i], uint32(i)
	rw := uring.SQEIOLink | uring.SQEFixedFile | b.rw
	if n := st.hdrDone; n < blockstore.HeaderSize {
		b.add(i, stepWriteHeader, rw).PrepareWriteFixed(int(slot), b.hdr(i)[n:], uint64(n), 0)
	}
	if n := int(st.payDone); n < len(o.buf) {
		rest, off := o.buf[n:], uint64(blockstore.HeaderSize+n)
		if k := b.bufIndex(rest); k > 0 {
			b.add(i, stepWritePayload, rw).PrepareWriteFixed(int(slot), rest, off, uint16(k))
		} else {
			b.add(i, stepWritePayload, rw).PrepareWrite(int(slot), rest, off)
		}
	}
	if b.t.opts.Durability >= blockstore.DurabilityData {
		b.add(i, stepFsync, uring.SQEIOLink|uring.SQEFixedFile).PrepareFsync(int(slot), false)
	}
	b.add(i, stepRename, uring.SQEIOHardlink).PrepareRenameat(b.nsFD, &m.tmp[0], b.nsFD, &m.path[0], 0)
	b.add(i, stepClose, 0).PrepareCloseDirect(slot)
}

// firstFailure returns the first step of the phase that failed other than
// by being canceled as part of a broken chain, ignoring MKDIRAT (EEXIST is
// its usual answer).
func (st *opState) firstFailure(want []int32) (int, error) {
	for k := range st.steps {
		r := st.res[k]
		if st.kinds[k] == stepMkdir || st.kinds[k] == stepClose {
			continue
		}
		if r < 0 {
			return int(k), syscall.Errno(-r)
		}
		if w := want[k]; w >= 0 && r < w {
			return int(k), io.ErrShortWrite
		}
	}
	return -1, nil
}

func (b *uringBackend) cancel(i int32, o *op) {
	st := &b.st[i]
	for k := range st.steps {
		s := b.sqe()
		s.PrepareCancel(ud(i, int(k)), 0)
		s.UserData = cancelUD
	}
}

func (b *uringBackend) wake() { b.waker.Wake() }

// reap copies out completions and handles them: a finished op goes to
// doneQ, one with another phase to next.
func (b *uringBackend) reap() {
	for {
		n := b.ring.Reap(b.cqes)
		if n == 0 {
			return
		}
		for _, c := range b.cqes[:n] {
			b.handle(c)
		}
	}
}

func (b *uringBackend) handle(c uring.CQE) {
	switch {
	case c.UserData == wakeUD:
		b.waker.Arm(b.sqe(), wakeUD)
		return
	case c.UserData&cancelUD != 0:
		return
	}
	i, step := int32(c.UserData>>8), int(c.UserData&0xff)
	st := &b.st[i]
	st.res[step] = c.Res
	st.pending--
	switch {
	case st.kinds[step] == stepOpen && c.Res >= 0:
		st.slotOpen = true
	case st.kinds[step] == stepClose && c.Res >= 0:
		st.slotOpen = false
	}
	switch {
	case st.pending == 0:
		b.evaluate(i, &b.s.ops[i])
	case b.s.ops[i].canceled:
		// A hard link started the next step after the canceled one, and
		// the kernel could not cancel a step that had not started: ask
		// again for what follows.
		for k := step + 1; k < int(st.steps); k++ {
			s := b.sqe()
			s.PrepareCancel(ud(i, k), 0)
			s.UserData = cancelUD
		}
	}
}

// evaluate judges op i's finished phase: it either sets the op's outcome
// and queues it on doneQ, or moves it to its next phase.
func (b *uringBackend) evaluate(i int32, o *op) {
	st, m := &b.st[i], &b.om[i]
	if st.phase == phaseClose {
		st.slotOpen = false // closed, or the kernel says there was nothing to close
		b.doneQ = append(b.doneQ, i)
		return
	}
	finish := func(s Status, err error) {
		o.status, o.err = s, err
		if st.slotOpen {
			// A broken chain canceled the CLOSE: the slot must be
			// emptied before the op is reused.
			st.phase = phaseClose
			b.next = append(b.next, i)
			return
		}
		b.doneQ = append(b.doneQ, i)
	}
	switch o.kind {
	case OpLookup:
		r := st.res[0]
		switch {
		case r >= 0:
			finish(StatusFound, nil)
		case r == -int32(unix.ENOENT):
			finish(StatusMissing, nil)
		default:
			finish(StatusFailed, b.t.pathError(stepOps[st.kinds[0]], m.path[:], syscall.Errno(-r)))
		}

	case OpLoad:
		if st.phase == phaseQuarantine {
			finish(o.status, o.err) // outcome set before the quarantine; its own result does not matter
			return
		}
		open, hdrN, payN := st.res[0], st.res[1], st.res[2]
		switch {
		case open == -int32(unix.ENOENT):
			finish(StatusMissing, nil)
		case open < 0:
			finish(StatusFailed, b.t.pathError("openat", m.path[:], syscall.Errno(-open)))
		case hdrN < 0:
			finish(StatusFailed, b.t.pathError("read", m.path[:], syscall.Errno(-hdrN)))
		case payN < 0 && hdrN == blockstore.HeaderSize:
			finish(StatusFailed, b.t.pathError("read", m.path[:], syscall.Errno(-payN)))
		default:
			s, quarantine, err := loadOutcome(o.keyBytes(), b.hdr(i), o.buf, int(hdrN), int(max(payN, 0)))
			if !quarantine {
				finish(s, err)
				return
			}
			o.status, o.err = s, err
			st.qpath = b.t.quarantinePath(st.qpath[:0], o.keyBytes())
			st.phase = phaseQuarantine
			b.next = append(b.next, i)
		}

	case OpStore:
		b.evaluateStore(i, o, finish)
	}
}

func (b *uringBackend) evaluateStore(i int32, o *op, finish func(Status, error)) {
	st, m := &b.st[i], &b.om[i]
	switch st.phase {
	case phaseCleanup:
		finish(StatusFailed, st.cause)
		return
	case phaseDirSync:
		if k, err := st.firstFailure(noShortCounts[:]); k >= 0 {
			// Steps come in threes, one directory each, in m.dirs order.
			dir := m.dirs[:]
			for range k / 3 {
				dir = dir[bytes.IndexByte(dir, 0)+1:]
			}
			finish(StatusFailed, b.t.pathError(stepOps[st.kinds[k]], dir, err.(syscall.Errno)))
			return
		}
		finish(StatusStored, nil)
		return
	}
	want := storeWant(st, len(o.buf))
	k, err := st.firstFailure(want[:])
	if err == io.ErrShortWrite && st.resumes < 8 && st.res[k] > 0 {
		// A short write says nothing about why (a full disk, a signal):
		// write the rest, as write(2) callers do, to learn the errno.
		st.resumes++
		st.progress()
		st.phase = phaseResume
		b.next = append(b.next, i)
		return
	}
	if k < 0 {
		for k := range st.steps {
			if st.kinds[k] == stepMkdir && st.res[k] == 0 {
				st.created = true
			}
		}
		b.rememberDir(i)
		if b.t.opts.Durability == blockstore.DurabilityFull {
			st.phase = phaseDirSync
			b.next = append(b.next, i)
			return
		}
		finish(StatusStored, nil)
		return
	}
	kind := st.kinds[k]
	if kind == stepOpen && err == syscall.ENOENT && !st.retried && !o.canceled {
		// The directory is missing (new, or removed under us): create it and try once more.
		st.retried = true
		b.forgetDir(i)
		b.nsFD = b.ns.renew(b.nsFD)
		b.next = append(b.next, i)
		return
	}
	path := m.tmp[:]
	if kind == stepRename {
		path = m.path[:]
	}
	var pe error
	if errno, ok := err.(syscall.Errno); ok {
		pe = b.t.pathError(stepOps[kind], path, errno)
	} else {
		pe = b.t.pathError(stepOps[kind], path, syscall.EIO)
		pe = fmt.Errorf("%w (%w)", pe, err)
	}
	if kind == stepOpen {
		finish(StatusFailed, pe) // nothing was created
		return
	}
	st.cause = pe
	st.phase = phaseCleanup
	b.next = append(b.next, i)
}

var noShortCounts = [stepsMax]int32{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1}

// storeWant is the byte count each step of a store's phase must return;
// -1 where any non-negative result is success.
func storeWant(st *opState, payload int) [stepsMax]int32 {
	want := noShortCounts
	for k := range st.steps {
		switch st.kinds[k] {
		case stepWriteHeader:
			want[k] = blockstore.HeaderSize - st.hdrDone
		case stepWritePayload:
			want[k] = int32(payload) - st.payDone
		}
	}
	return want
}

// progress adds what the phase's writes wrote to hdrDone and payDone.
func (st *opState) progress() {
	for k := range st.steps {
		if r := st.res[k]; r > 0 {
			switch st.kinds[k] {
			case stepWriteHeader:
				st.hdrDone += r
			case stepWritePayload:
				st.payDone += r
			}
		}
	}
}

func (b *uringBackend) rememberDir(i int32) {
	b.dirKey = append(b.t.store.Layout().AppendDir(b.dirKey[:0], b.s.ops[i].keyBytes()), 0)
	if _, known := b.dirs[string(b.dirKey)]; !known {
		b.dirs[string(b.dirKey)] = struct{}{} // the one allocation, per new directory
	}
}

func (b *uringBackend) forgetDir(i int32) {
	b.dirKey = append(b.t.store.Layout().AppendDir(b.dirKey[:0], b.s.ops[i].keyBytes()), 0)
	delete(b.dirs, string(b.dirKey))
}

// wait submits what is queued and collects finished ops, blocking for at
// most d when nothing has finished. One io_uring_enter does the submit, the
// deferred task work and the wait; SQEs that the reaped completions queue
// go with the next one.
func (b *uringBackend) wait(d time.Duration, done []int32) []int32 {
	if len(b.doneQ) == 0 && b.ring.Ready() == 0 {
		if _, err := b.ring.SubmitAndWait(1, max(d, time.Microsecond)); err != nil && !errors.Is(err, uring.ErrRetry) {
			panic("tier: io_uring wait: " + err.Error())
		}
	} else {
		b.submit()
	}
	b.reap()
	b.prepareNext()
	done = append(done, b.doneQ...)
	b.doneQ = b.doneQ[:0]
	return done
}

func (b *uringBackend) prepareNext() {
	for len(b.next) > 0 {
		next := b.next
		b.next = nil
		for _, i := range next {
			b.prepare(i, &b.s.ops[i])
		}
		if b.next == nil {
			b.next = next[:0]
		}
	}
}

func (b *uringBackend) close(leak bool) {
	if leak {
		// Late completions still write into om, hdrs and caller buffers,
		// and late OPENATs resolve nsFD: keep all of it.
		leaked.Lock()
		leaked.backends = append(leaked.backends, b)
		leaked.Unlock()
		if b.ring != nil {
			b.ring.Close()
		}
		return
	}
	if b.ring != nil {
		b.ring.Close()
	}
	if b.waker != nil {
		b.waker.Close()
	}
	if b.hdrs != nil {
		uring.FreeBuffer(b.hdrs)
	}
	if b.ns != nil {
		b.ns.close()
	}
	b.pinner.Unpin()
}
