package tier

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
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
//   lookup (O_PATH): OPENAT2(O_PATH) into slot i ─link─ CLOSE slot i
//   lookup (mixed): even ops O_PATH, odd ops STATX
//   load:   OPENAT2 into slot i ─link─ READ_FIXED past the block's end ─hardlink─ READ_FIXED header
//           ─hardlink─ READ payload ─link─ … ─link─ CLOSE
//           then, for a short read: READ the rest ─link─ … ─link─ CLOSE;
//           for a corrupt block: RENAMEAT into the quarantine
//   store:  [MKDIRAT ─hardlink─ ...] OPENAT2(O_CREAT|O_EXCL) tmp into slot i ─link─ WRITE_FIXED header
//           ─link─ WRITE payload ─link─ … [─link─ FSYNC] ─link─ CLOSE ─link─ RENAMEAT tmp → final
//           then for a short write: WRITE the rest ─link─ … ─link─ CLOSE ─link─ RENAMEAT;
//           on failure: UNLINKAT tmp [CLOSE slot i]; for DurabilityFull: OPENAT dir ─link─ FSYNC ─hardlink─ CLOSE
//
// Invariants: a phase is submitted whole (reserve makes room for stepsMax
// SQEs first; the kernel does not carry a link across two submissions, and
// a split store chain once ran its RENAMEAT after a failed WRITE), and its
// last SQE carries no link flag. A store's RENAMEAT is linked behind every
// write, the FSYNC and the CLOSE, so it runs only if all of them succeeded:
// a failed store never replaces or creates a block at its final path. A
// read or write moves at most rwMax bytes and at most chunksMax of them go
// in one phase; a short one continues in the next phase, until done. Opens
// resolve beneath the namespace directory without following any symlink,
// and loads open with O_NONBLOCK, so a FIFO at a block path cannot block.
//
// Handling a completion only records what it means: SQEs are prepared after
// the batch of completions is handled, never while reaping, so reaping
// never re-enters itself.

const (
	wakeUD    = ^uint64(0)
	cancelUD  = 1 << 62 // user_data of ASYNC_CANCEL SQEs; their CQEs are ignored
	stepsMax  = 16      // SQEs in one phase of an op
	chunksMax = 4       // payload reads or writes in one phase
)

// rwMax is the most bytes one READ or WRITE asks for: the kernel moves at
// most MAX_RW_COUNT (INT_MAX rounded down to a page, include/linux/fs.h)
// per call and reports a short count past it. A variable so that tests can
// make small blocks span many chunks and phases.
var rwMax = 0x7ffff000

// resolveBeneath keeps every open inside the namespace directory and off
// symlinks (openat2(2)): in a directory shared by tenants, a planted link
// must not make the tier read or write someone else's file.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS

type phase uint8

const (
	phaseMain phase = iota
	phaseQuarantine
	phaseCleanup
	phaseDirSync
	phaseResume // a load's reads or a store's writes went short, or the block spans more phases: move the rest
	phaseClose  // the op is decided but its slot is still open: close it
	phaseType   // a load met something odd: STATX says whether a regular file is there
)

type stepKind uint8

const (
	stepMkdir stepKind = iota
	stepOpen
	stepReadTail // a load's read past the block's end: a valid block file has nothing there
	stepReadHeader
	stepRead
	stepWriteHeader
	stepWritePayload
	stepFsync
	stepRename
	stepUnlink
	stepClose
	stepStatx
	stepOpenDir // a store checks that a directory it creates under is not a link
)

var stepOps = [...]string{"mkdirat", "openat", "read", "read", "read", "write", "write", "fsync", "renameat", "unlinkat", "close", "statx", "openat"}

// opMem is the memory of op i that the kernel reads or writes.
type opMem struct {
	path   [256]byte // final path, NUL-terminated, relative to the namespace directory
	tmp    [256]byte // temporary path of a store
	dirs   [256]byte // MKDIRAT paths, each NUL-terminated; the directory to fsync
	stx    unix.Statx_t
	how    unix.OpenHow // OPENAT2's flags, read by the kernel when the open is submitted
	dirHow unix.OpenHow // the same for a store's directory checks, in the same submission
}

// opState tracks op i's current phase. Owner-only.
type opState struct {
	phase    phase
	steps    uint8
	pending  uint8
	kinds    [stepsMax]stepKind
	want     [stepsMax]int32 // bytes a read or write step asks for; for a step on a directory, its path's offset in dirs
	res      [stepsMax]int32
	slotOpen bool   // the op's fixed-file slot holds a file
	created  bool   // a store made directories, whose parents need a sync too (DurabilityFull)
	retried  bool   // a store already re-created its directories once
	eof      bool   // a load's read met the end of the file
	moveAway bool   // a load's verdict, kept through its type check: quarantine the file
	tail     int32  // bytes a load found past the end of a block of the tier's size
	hdrDone  int64  // header bytes a load has read or a store has written
	payDone  int64  // payload bytes likewise
	cause    error  // a store's failure, kept through the cleanup phase
	qpath    []byte // quarantine path, NUL-terminated
}

type uringBackend struct {
	t        *Tier
	s        *shard
	ring     *uring.Ring
	waker    *uring.Waker
	nsFD     int
	ns       *nsDirFD // owns nsFD, and replaces it when the directory goes (nsdir.go)
	direct   bool
	rw       uint8   // SQE flags for reads and writes: SQEAsync where the filesystem may block inline
	om       []opMem // pinned; referenced by SQEs until their CQEs
	pinner   runtime.Pinner
	hdrs     []byte // OpsMax header buffers, mmap'd (aligned); registered buffer 0
	st       []opState
	cqes     []uring.CQE
	next     []int32    // ops whose next phase is to be prepared
	doneQ    []int32    // finished ops not yet handed to the shard
	recancel []int32    // canceled ops whose later steps a hard link started: cancel those too
	rearm    bool       // the waker fired: arm it again
	last     *uring.SQE // the SQE add prepared last, so prepare can end the phase's chain
	dirs     map[string]struct{}
	dirKey   []byte
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
			b.close()
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
// Only for SQEs that link to nothing: a chain takes reserve first.
func (b *uringBackend) sqe() *uring.SQE {
	for {
		if s := b.ring.GetSQE(); s != nil {
			return s
		}
		b.submit()
	}
}

// reserve makes room for a whole phase (stepsMax SQEs) before it is
// prepared, so that its chain goes to the kernel in one submission.
func (b *uringBackend) reserve() {
	for b.ring.SQSpace() < stepsMax {
		b.submit()
	}
}

// submit hands the queued SQEs to the kernel. When the kernel is busy it
// reaps completions first; handling them prepares nothing, so this is safe
// wherever SQEs are prepared.
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

// add prepares step kind k of op i, in order; want is the byte count a
// read or write asks for.
func (b *uringBackend) add(i int32, k stepKind, flags uint8, want int) *uring.SQE {
	st := &b.st[i]
	if st.steps == stepsMax {
		panic("tier: an op's phase needs more than stepsMax SQEs (a layout with deeper directories?)")
	}
	s := b.ring.GetSQE()
	if s == nil {
		panic("tier: SQ full inside a reserved phase")
	}
	s.UserData = ud(i, int(st.steps))
	s.Flags |= flags
	st.kinds[st.steps] = k
	st.want[st.steps] = int32(want)
	st.res[st.steps] = 0
	st.steps++
	st.pending++
	b.last = s
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

// prepare queues the SQEs of op i's current phase, as one chain.
func (b *uringBackend) prepare(i int32, o *op) {
	b.reserve()
	st := &b.st[i]
	st.steps, st.pending = 0, 0
	m := &b.om[i]
	slot := uint32(i)
	switch {
	case o.kind == OpLookup && (b.t.opts.Lookup == LookupStatx || b.t.opts.Lookup == LookupMixed && i%2 == 1):
		b.add(i, stepStatx, 0, 0).PrepareStatx(b.nsFD, &m.path[0], unix.AT_STATX_DONT_SYNC|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_SIZE, &m.stx)
	case o.kind == OpLookup:
		m.how = unix.OpenHow{Flags: unix.O_PATH, Resolve: resolveBeneath}
		b.add(i, stepOpen, uring.SQEIOLink, 0).PrepareOpenat2Direct(b.nsFD, &m.path[0], &m.how, slot)
		b.add(i, stepClose, 0, 0).PrepareCloseDirect(slot)
	case o.kind == OpLoad && st.phase == phaseMain:
		flags := uint64(unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY)
		if b.direct && aligned(o.buf) {
			flags |= unix.O_DIRECT
		}
		m.how = unix.OpenHow{Flags: flags, Resolve: resolveBeneath}
		// An O_RDONLY open calls the filesystem's open (FUSE_OPEN, an NFSv4
		// OPEN), which may block like a read: it goes async with them.
		b.add(i, stepOpen, uring.SQEIOLink|b.rw, 0).PrepareOpenat2Direct(b.nsFD, &m.path[0], &m.how, slot)
		// The header buffer first serves the read past the block's end, whose
		// 0 says the file is not longer than a block; the header read after
		// it overwrites it.
		rw := uring.SQEIOHardlink | uring.SQEFixedFile | b.rw
		b.add(i, stepReadTail, rw, blockstore.HeaderSize).PrepareReadFixed(int(slot), b.hdr(i), uint64(blockstore.HeaderSize+len(o.buf)), 0)
		b.add(i, stepReadHeader, rw, blockstore.HeaderSize).PrepareReadFixed(int(slot), b.hdr(i), 0, 0)
		b.prepareLoadRest(i, o)
	case o.kind == OpLoad && st.phase == phaseResume:
		if n := st.hdrDone; n < blockstore.HeaderSize {
			b.add(i, stepReadHeader, uring.SQEIOLink|uring.SQEFixedFile|b.rw, int(blockstore.HeaderSize-n)).PrepareReadFixed(int(slot), b.hdr(i)[n:], uint64(n), 0)
		}
		b.prepareLoadRest(i, o)
	case o.kind == OpLoad && st.phase == phaseType:
		b.add(i, stepStatx, 0, 0).PrepareStatx(b.nsFD, &m.path[0], unix.AT_STATX_DONT_SYNC|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE, &m.stx)
	case o.kind == OpLoad && st.phase == phaseQuarantine:
		b.add(i, stepRename, 0, 0).PrepareRenameat(b.nsFD, &m.path[0], unix.AT_FDCWD, &st.qpath[0], 0)
	case o.kind == OpStore && st.phase == phaseMain:
		b.prepareStore(i, o)
	case o.kind == OpStore && st.phase == phaseResume:
		b.prepareStoreRest(i, o)
	case st.phase == phaseClose:
		b.add(i, stepClose, 0, 0).PrepareCloseDirect(slot)
	case o.kind == OpStore && st.phase == phaseCleanup:
		b.add(i, stepUnlink, 0, 0).PrepareUnlinkat(b.nsFD, &m.tmp[0], 0)
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
		// directory's OPENAT.
		for start := 0; start < len(dirs); start += bytes.IndexByte(dirs[start:], 0) + 1 {
			b.add(i, stepOpen, uring.SQEIOLink|b.rw, 0).PrepareOpenatDirect(b.nsFD, &m.dirs[start], unix.O_RDONLY|unix.O_DIRECTORY, 0, slot)
			b.add(i, stepFsync, uring.SQEIOHardlink|uring.SQEFixedFile, 0).PrepareFsync(int(slot), false)
			b.add(i, stepClose, uring.SQEIOLink, 0).PrepareCloseDirect(slot)
		}
	default:
		panic(fmt.Sprintf("tier: no phase %d for %v", st.phase, o.kind))
	}
	// The phase's chain ends here: a link flag on its last SQE would tie
	// the next op's first SQE to it.
	b.last.Flags &^= uring.SQEIOLink | uring.SQEIOHardlink
}

// chunk returns the part of buf from done that one READ or WRITE moves.
func chunk(buf []byte, done int64) []byte {
	return buf[done:min(int64(len(buf)), done+int64(rwMax))]
}

// prepareLoadRest queues reads of the payload from payDone, at most
// chunksMax of them, then the CLOSE if they reach the end. A short read
// breaks the link: the CLOSE is canceled and the next phase reads on.
func (b *uringBackend) prepareLoadRest(i int32, o *op) {
	st, slot := &b.st[i], uint32(i)
	rw := uring.SQEIOLink | uring.SQEFixedFile | b.rw
	done := st.payDone
	for range chunksMax {
		if done == int64(len(o.buf)) {
			break
		}
		c := chunk(o.buf, done)
		off := uint64(blockstore.HeaderSize + done)
		if k := b.bufIndex(c); k > 0 {
			b.add(i, stepRead, rw, len(c)).PrepareReadFixed(int(slot), c, off, uint16(k))
		} else {
			b.add(i, stepRead, rw, len(c)).PrepareRead(int(slot), c, off)
		}
		done += int64(len(c))
	}
	if done == int64(len(o.buf)) {
		b.add(i, stepClose, 0, 0).PrepareCloseDirect(slot)
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
		// MKDIRAT follows symlinks on the way, so before each level below
		// the first, the level above is opened beneath the namespace
		// without following links: a link there breaks the chain.
		m.dirHow = unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY, Resolve: resolveBeneath}
		d, parent := m.dirs[:0], -1
		for k := range len(dir) - 1 {
			if dir[k+1] != '/' && dir[k+1] != 0 {
				continue
			}
			if parent >= 0 {
				b.add(i, stepOpenDir, uring.SQEIOLink, parent).PrepareOpenat2Direct(b.nsFD, &m.dirs[parent], &m.dirHow, slot)
				b.add(i, stepClose, uring.SQEIOLink, 0).PrepareCloseDirect(slot)
			}
			parent = len(d)
			d = append(append(d, dir[:k+1]...), 0)
			b.add(i, stepMkdir, uring.SQEIOHardlink, parent).PrepareMkdirat(b.nsFD, &d[parent], 0o755)
		}
	}
	blockstore.EncodeHeader(b.hdr(i), key, o.buf)
	m.how = unix.OpenHow{Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL, Mode: 0o644, Resolve: resolveBeneath}
	b.add(i, stepOpen, uring.SQEIOLink|b.rw, 0).PrepareOpenat2Direct(b.nsFD, &m.tmp[0], &m.how, slot)
	b.prepareStoreRest(i, o)
}

// prepareStoreRest queues what a store does once its temporary file is
// open: write what is left of the header and payload (at most chunksMax
// payload writes in a phase), then sync, close and publish.
func (b *uringBackend) prepareStoreRest(i int32, o *op) {
	st, m, slot := &b.st[i], &b.om[i], uint32(i)
	rw := uring.SQEIOLink | uring.SQEFixedFile | b.rw
	if n := st.hdrDone; n < blockstore.HeaderSize {
		b.add(i, stepWriteHeader, rw, int(blockstore.HeaderSize-n)).PrepareWriteFixed(int(slot), b.hdr(i)[n:], uint64(n), 0)
	}
	done := st.payDone
	for range chunksMax {
		if done == int64(len(o.buf)) {
			break
		}
		c := chunk(o.buf, done)
		off := uint64(blockstore.HeaderSize + done)
		if k := b.bufIndex(c); k > 0 {
			b.add(i, stepWritePayload, rw, len(c)).PrepareWriteFixed(int(slot), c, off, uint16(k))
		} else {
			b.add(i, stepWritePayload, rw, len(c)).PrepareWrite(int(slot), c, off)
		}
		done += int64(len(c))
	}
	if done < int64(len(o.buf)) {
		return // the next phase writes on
	}
	if b.t.opts.Durability >= blockstore.DurabilityData {
		b.add(i, stepFsync, uring.SQEIOLink|uring.SQEFixedFile, 0).PrepareFsync(int(slot), false)
	}
	// Close before the rename: on NFS, close reports deferred write errors,
	// and a store whose close failed must not publish.
	b.add(i, stepClose, uring.SQEIOLink, 0).PrepareCloseDirect(slot)
	b.add(i, stepRename, 0, 0).PrepareRenameat(b.nsFD, &m.tmp[0], b.nsFD, &m.path[0], 0)
}

// errShort marks a write that moved fewer bytes than it asked for.
var errShort = errors.New("short write")

// firstFailure returns the first step of the phase that failed, other than
// by being canceled as part of a broken chain, and why; a MKDIRAT counts
// unless it succeeded or found the directory there (EEXIST).
func (st *opState) firstFailure() (int, error) {
	for k := range st.steps {
		r := st.res[k]
		switch {
		case st.kinds[k] == stepMkdir && (r >= 0 || r == -int32(unix.EEXIST)):
		case r < 0:
			return int(k), syscall.Errno(-r)
		case (st.kinds[k] == stepWriteHeader || st.kinds[k] == stepWritePayload) && r < st.want[k]:
			return int(k), errShort
		}
	}
	return -1, nil
}

func (b *uringBackend) cancel(i int32, o *op) {
	b.cancelFrom(i, 0)
}

// cancelFrom asks the kernel to cancel op i's steps from step k on.
func (b *uringBackend) cancelFrom(i int32, k int) {
	for ; k < int(b.st[i].steps); k++ {
		s := b.sqe()
		s.PrepareCancel(ud(i, k), 0)
		s.UserData = cancelUD
	}
}

func (b *uringBackend) wake() { b.waker.Wake() }

// reap copies out completions and handles them: a finished op goes to
// doneQ, one with another phase to next. It prepares no SQE.
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

// handle records what completion c means. It must not prepare SQEs: it
// runs inside reap, which submit may call.
func (b *uringBackend) handle(c uring.CQE) {
	switch {
	case c.UserData == wakeUD:
		b.rearm = true
		return
	case c.UserData&cancelUD != 0:
		return
	}
	i, step := int32(c.UserData>>8), int(c.UserData&0xff)
	st := &b.st[i]
	if step >= int(st.steps) || st.pending == 0 || !b.s.ops[i].inUse {
		panic(fmt.Sprintf("tier: completion for op %d step %d, which has %d steps and %d pending", i, step, st.steps, st.pending))
	}
	st.res[step] = c.Res
	st.pending--
	switch {
	case (st.kinds[step] == stepOpen || st.kinds[step] == stepOpenDir) && c.Res >= 0:
		st.slotOpen = true
	case st.kinds[step] == stepClose && c.Res != -int32(unix.ECANCELED):
		st.slotOpen = false // closed, or the kernel says there was nothing to close
	}
	switch {
	case st.pending == 0:
		b.evaluate(i, &b.s.ops[i])
	case b.s.ops[i].canceled && step+1 < int(st.steps):
		// A hard link started the next step after the canceled one, and
		// the kernel could not cancel a step that had not started: ask
		// again for what follows, once the batch is handled.
		b.recancel = append(b.recancel, i, int32(step+1))
	}
}

// evaluate judges op i's finished phase: it either sets the op's outcome
// and queues it on doneQ, or queues its next phase on next.
func (b *uringBackend) evaluate(i int32, o *op) {
	st, m := &b.st[i], &b.om[i]
	if st.phase == phaseClose {
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
		case r >= 0 && (st.kinds[0] != stepStatx || m.stx.Mode&unix.S_IFMT == unix.S_IFREG):
			finish(StatusFound, nil)
		case r >= 0, r == -int32(unix.ENOENT), r == -int32(unix.ELOOP):
			// Not a regular file, or a symlink on the way: no block there.
			finish(StatusMissing, nil)
		default:
			finish(StatusFailed, b.t.pathError(stepOps[st.kinds[0]], m.path[:], syscall.Errno(-r)))
		}
	case OpLoad:
		b.evaluateLoad(i, o, finish)
	case OpStore:
		b.evaluateStore(i, o, finish)
	}
}

func (b *uringBackend) evaluateLoad(i int32, o *op, finish func(Status, error)) {
	st, m := &b.st[i], &b.om[i]
	switch st.phase {
	case phaseQuarantine:
		finish(o.status, o.err) // outcome set before the quarantine; its own result does not matter
		return
	case phaseType:
		if st.res[0] >= 0 && m.stx.Mode&unix.S_IFMT != unix.S_IFREG {
			o.status, o.err, st.moveAway = StatusCorrupt, blockstore.CheckRegular(uint32(m.stx.Mode)), true
		}
		b.settleLoad(i, o, finish)
		return
	}
	moved := false
	for k := range st.steps {
		r, kind := st.res[k], st.kinds[k]
		switch {
		case kind == stepOpen && r == -int32(unix.ENOENT):
			finish(StatusMissing, nil)
			return
		case kind == stepOpen && r == -int32(unix.ELOOP):
			// Never quarantined: the link may be a directory on the way,
			// and a rename through it would move someone else's file.
			finish(StatusCorrupt, fmt.Errorf("%w: symlink at block path: %w", blockstore.ErrCorrupt, b.t.pathError("openat", m.path[:], syscall.ELOOP)))
			return
		case kind == stepOpen && (r == -int32(unix.EINVAL) || r == -int32(unix.EISDIR)):
			// O_DIRECT or O_RDONLY refused: perhaps not a regular file.
			b.checkType(i, o, StatusFailed, b.t.pathError("openat", m.path[:], syscall.Errno(-r)), false)
			return
		case kind == stepOpen && r < 0:
			finish(StatusFailed, b.t.pathError("openat", m.path[:], syscall.Errno(-r)))
			return
		case kind == stepClose || kind == stepOpen || r == -int32(unix.ECANCELED):
			// A CLOSE's result does not matter to a read; a canceled read
			// did not run (a short read before it broke the chain).
		case r == -int32(unix.EISDIR):
			b.checkType(i, o, StatusFailed, b.t.pathError("read", m.path[:], syscall.EISDIR), false)
			return
		case r < 0:
			finish(StatusFailed, b.t.pathError("read", m.path[:], syscall.Errno(-r)))
			return
		case kind == stepReadTail:
			st.tail = r
		default:
			moved = moved || r > 0
			if kind == stepReadHeader {
				st.hdrDone += int64(r)
			} else {
				st.payDone += int64(r)
			}
			st.eof = st.eof || r == 0
		}
	}
	if !st.eof && (st.hdrDone < blockstore.HeaderSize || st.payDone < int64(len(o.buf))) {
		if !moved || o.canceled {
			// Nothing read and no end of file: the reads were canceled.
			finish(StatusFailed, b.t.pathError("read", m.path[:], syscall.ECANCELED))
			return
		}
		st.phase = phaseResume
		b.next = append(b.next, i)
		return
	}
	// The file's length as the reads found it.
	size := st.hdrDone
	switch {
	case st.hdrDone < blockstore.HeaderSize:
	case st.payDone < int64(len(o.buf)):
		size += st.payDone
	default:
		size += st.payDone + int64(st.tail)
	}
	s, quarantine, err := loadOutcome(o.keyBytes(), b.hdr(i)[:st.hdrDone], o.buf[:st.payDone], size, len(o.buf))
	if st.hdrDone < blockstore.HeaderSize {
		// Shorter than a header: a FIFO or a device reads so too.
		b.checkType(i, o, s, err, quarantine)
		return
	}
	o.status, o.err, st.moveAway = s, err, quarantine
	b.settleLoad(i, o, finish)
}

// checkType keeps a load's verdict while a STATX finds out whether a
// regular file is at the block's path; something else is corrupt (a FIFO,
// a directory, a device) whatever the reads said.
func (b *uringBackend) checkType(i int32, o *op, s Status, err error, quarantine bool) {
	o.status, o.err, b.st[i].moveAway = s, err, quarantine
	b.st[i].phase = phaseType
	b.next = append(b.next, i)
}

// settleLoad finishes a load with the verdict in o, moving the file to the
// quarantine first when the verdict says so.
func (b *uringBackend) settleLoad(i int32, o *op, finish func(Status, error)) {
	st := &b.st[i]
	if !st.moveAway {
		finish(o.status, o.err)
		return
	}
	st.qpath = b.t.quarantinePath(st.qpath[:0], o.keyBytes())
	st.phase = phaseQuarantine
	b.next = append(b.next, i)
}

func (b *uringBackend) evaluateStore(i int32, o *op, finish func(Status, error)) {
	st, m := &b.st[i], &b.om[i]
	switch st.phase {
	case phaseCleanup:
		finish(StatusFailed, st.cause)
		return
	case phaseDirSync:
		if k, err := st.firstFailure(); k >= 0 {
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
	for k := range st.steps {
		if r := st.res[k]; r > 0 && st.kinds[k] == stepWriteHeader {
			st.hdrDone += int64(r)
		} else if r > 0 && st.kinds[k] == stepWritePayload {
			st.payDone += int64(r)
		}
		if st.kinds[k] == stepMkdir && st.res[k] == 0 {
			st.created = true
		}
	}
	k, err := st.firstFailure()
	if k < 0 && st.kinds[st.steps-1] != stepRename {
		// Every write of the phase went through and more remain.
		st.phase = phaseResume
		b.next = append(b.next, i)
		return
	}
	if err == errShort && st.res[k] > 0 && !o.canceled {
		// A short write says nothing about why (a full disk, a signal):
		// write the rest, as write(2) callers do, to learn the errno.
		st.phase = phaseResume
		b.next = append(b.next, i)
		return
	}
	if k < 0 {
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
	if (kind == stepOpen || kind == stepMkdir || kind == stepOpenDir) && err == syscall.ENOENT && !st.retried && !o.canceled {
		// A directory is missing (new, or removed under us): create it and try once more.
		st.retried = true
		b.forgetDir(i)
		st.hdrDone, st.payDone = 0, 0
		b.nsFD = b.ns.renew(b.nsFD)
		b.next = append(b.next, i)
		return
	}
	var path []byte
	switch kind {
	case stepMkdir, stepOpenDir:
		// The first that failed is the cause; the steps after it failed
		// for want of its directory.
		path = m.dirs[st.want[k]:]
	case stepRename:
		path = m.path[:]
	default:
		path = m.tmp[:]
	}
	var pe error
	if errno, ok := err.(syscall.Errno); ok {
		pe = b.t.pathError(stepOps[kind], path, errno)
	} else {
		pe = fmt.Errorf("%w (%w)", b.t.pathError(stepOps[kind], path, syscall.EIO), err)
	}
	if !st.tmpCreated() {
		finish(StatusFailed, pe) // nothing was created
		return
	}
	st.cause = pe
	st.phase = phaseCleanup
	b.next = append(b.next, i)
}

// tmpCreated reports whether a store's OPENAT of its temporary file ran
// and succeeded in this phase or an earlier one.
func (st *opState) tmpCreated() bool {
	if st.phase == phaseResume {
		return true
	}
	for k := range st.steps {
		if st.kinds[k] == stepOpen {
			return st.res[k] >= 0
		}
	}
	return false
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

// prepareNext prepares what the handled completions asked for: next
// phases, further cancels and the waker. Preparing may submit, and a busy
// kernel may make submit reap more, so it runs until nothing is left.
func (b *uringBackend) prepareNext() {
	for len(b.next) > 0 || len(b.recancel) > 0 || b.rearm {
		if b.rearm {
			b.rearm = false
			b.waker.Arm(b.sqe(), wakeUD)
		}
		for len(b.recancel) > 0 {
			n := len(b.recancel)
			i, k := b.recancel[n-2], b.recancel[n-1]
			b.recancel = b.recancel[:n-2]
			b.cancelFrom(i, int(k))
		}
		if len(b.next) > 0 {
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
}

// close releases the ring and everything the kernel could reference. The
// shard calls it only once no op is in flight.
func (b *uringBackend) close() {
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
