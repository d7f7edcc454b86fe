package tier

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/uring"
	"golang.org/x/sys/unix"
)

// The io_uring engine. Each shard's owner goroutine is the only one to
// touch its ring. It sleeps on a channel when the kernel holds none of its
// operations, and otherwise on an eventfd that the ring signals, in Go's
// netpoller: either way it holds no thread and no P. (With fewer rings than
// Ps, where a caller finds a P whatever the owners hold, an owner locked to
// its thread sleeps in io_uring_enter instead.) On a local filesystem
// the owner is an ordinary goroutine and its ring has neither SINGLE_ISSUER
// nor DEFER_TASKRUN: waking it costs what waking any goroutine costs (a
// round trip of 8 lookups, 26 µs against 136 µs for an owner locked to its
// thread), and with a ring per CPU the owners' inline opens, copies and
// checksums run on every CPU. Each Go thread that submits has its own
// kernel workers, each limited to WorkersMax; on a local filesystem they
// serve only bounded work (page-cache misses, cold lookups). On FUSE, NFS
// and unknown filesystems, where every open, read and write goes to a
// kernel worker and one may hang, and with STATX lookups, which always go
// to kernel workers, the owner is locked to its thread and the ring is
// SINGLE_ISSUER (EngineInfo.OwnThreads): one set of workers per ring, at
// most WorkersMax, whatever Go does with its threads. With STATX lookups
// it is DEFER_TASKRUN too; on FUSE, NFS and unknown filesystems it is not,
// so that a worker that finishes a step of a chain runs the next one
// itself instead of handing it back to the owner.
// On a local filesystem stores are not the ring's: io_uring hands their
// O_CREAT opens, renames and MKDIRs to kernel workers, each hand-off
// costing more CPU than the call, and the workers, which Go's Ps do not
// bound, take the caller's CPU; so the owner passes stores, O_DIRECT ones
// too, to its store pool (a syncPool, EngineInfo.StoresSync), whose
// goroutines make the calls and wake it when they finish, all but an
// O_DIRECT store's write while many are in flight (ringWriteMin): the
// worker hands that back to the owner's ring (ringWrite), into blocks it
// allocated first, and parks until the owner answers; no thread waits for
// the device. On tmpfs, whose
// files do not take IOCB_NOWAIT, every read would go to a kernel worker
// too: loads go to the pool there as well (EngineInfo.LoadsSync).
//
// The owner executes blockstore's programs: each step of a
// phase becomes one SQE, linked as the step says (LinkOnSuccess is
// IOSQE_IO_LINK, LinkAlways IOSQE_IO_HARDLINK), with user_data op index <<
// 8 | step. Op i's file is fixed-file slot i. A LinkOnSuccess step posts
// no completion when it succeeds (cqeSkips): the next one posted says how
// it went.
//
// Invariants: a phase is submitted whole (reserve makes room for StepsMax
// SQEs first; the kernel does not carry a link across two submissions, and
// a split store chain once ran its RENAMEAT after a failed WRITE). Handling
// a completion only records it: SQEs are prepared after the batch of
// completions is handled, never while reaping, so reaping never re-enters
// itself. A completion names an op in use and a step of its current
// phase without a result. A violated invariant or an error of
// the ring itself fails the tier (ErrBroken to every key and submit), never
// the process embedding it.

const (
	wakeUD   = ^uint64(0)
	cancelUD = 1 << 62 // user_data of ASYNC_CANCEL SQEs; their CQEs are ignored
	writeUD  = 1 << 61 // user_data of a pool's write: | its slot in writes
)

// ringWrite is a write of a store's file that a worker of the store pool
// asks its owner to make on the ring: an O_DIRECT store's write, which
// would otherwise block the worker's thread for as long as the device
// takes (docs/performance.md, "the caller's longest calls"), when more
// than ringWriteMin stores are on the tier's store pools. A worker has
// one; the owner answers it on res.
type ringWrite struct {
	o      *op // the store
	fd     int
	s      *blockstore.Step
	res    chan int32
	sqEnd  uint32 // the ring's SQ tail after its SQE: Taken says the kernel has it
	broken error  // the ring broke before the write's answer: the store's error
}

// ringWrite makes w's write on the owner's ring and waits for it, parked:
// no thread waits for the device. A broken ring answers at once.
func (b *uringBackend) ringWrite(w *ringWrite) int32 {
	if ringWriteAsked != nil {
		ringWriteAsked(w.o)
	}
	b.writesMu.Lock()
	if b.writesErr != nil {
		w.broken = b.writesErr
		b.writesMu.Unlock()
		return -int32(unix.ECANCELED)
	}
	b.writesQ = append(b.writesQ, w)
	b.writesMu.Unlock()
	b.wake()
	return <-w.res
}

// ringWriteMin is how many stores the tier's store pools hold, all rings'
// together (Tier.poolStores), at most for an O_DIRECT store started then to
// make its write on its worker's thread, blocking it, as the sync engine's
// workers do; one started while they hold more writes on its ring. With
// few stores in flight a write on the ring costs more than a thread that
// waits for the device: the worker wakes the owner, whose ring completes
// the write in a thread that then wakes the worker, where a pwrite wakes
// its own thread. tierbench store --engine all --rounds 3 (64 KiB, a
// nodiscard loop ext4), 3 runs of each shape alternating with every write
// on the ring, io_uring's keys a second ÷ the sync engine's: one key a
// request at depth 4 1.01-1.16x against 0.78-0.88x, at 0.94-1.08x its CPU
// a store against 1.16-1.52x; 4 keys a request 1.05-1.20x against
// 1.09-1.16x; one key at depth 16 1.17-1.25x against 1.16-1.29x; batches
// of 16 1.40-1.69x against 1.25-1.40x; no Store or Poll call over 1 ms in
// those 36 rounds against 4. Counted over all rings: a ring's own count
// swings with how the keys fall, and at 16 stores in flight made 0.99-1.12x
// against 1.13-1.26x (one key at depth 16), 1.01x against 1.17x (4 keys).
// Tests set it to 0: every O_DIRECT store's write on the ring.
var ringWriteMin int32 = 4

// ringWriteAsked, when set (by tests), is called by a store pool's worker
// as it asks its owner for a write.
var ringWriteAsked func(o *op)

// takeWrites prepares the writes the store pool has asked for, each an
// SQE with the file's own descriptor (the pool opened it) and user_data
// writeUD | its slot in writes.
func (b *uringBackend) takeWrites() {
	b.writesMu.Lock()
	q := b.writesQ
	b.writesQ = b.spareW[:0]
	b.writesMu.Unlock()
	for _, w := range q {
		k := slices.Index(b.writes, nil)
		if k < 0 {
			k = len(b.writes)
			b.writes = append(b.writes, nil)
		}
		sq := b.sqe()
		if w.s.Op == blockstore.StepWritev {
			sq.PrepareWritev(w.fd, w.s.Vec, uint64(w.s.Off))
		} else {
			sq.PrepareWrite(w.fd, w.s.Buf, uint64(w.s.Off))
		}
		sq.UserData = writeUD | uint64(k)
		w.sqEnd = b.ring.SQTail()
		b.writes[k] = w
		b.nWrites++
	}
	b.spareW = q
}

// failWrites answers every write of the store pool, queued or in the
// kernel, when the ring breaks: each store fails with the ring's error,
// and one whose write the kernel took holds its buffer, as fail does.
func (b *uringBackend) failWrites() {
	b.writesMu.Lock()
	b.writesErr = b.broken
	q := b.writesQ
	b.writesQ = nil
	b.writesMu.Unlock()
	for _, w := range q {
		w.broken = b.broken
		w.res <- -int32(unix.ECANCELED)
	}
	for k, w := range b.writes {
		if w == nil {
			continue
		}
		if b.ring.Taken(w.sqEnd) {
			b.t.hold(w.o.holder)
		}
		w.broken = b.broken
		w.res <- -int32(unix.ECANCELED)
		b.writes[k] = nil
	}
	b.nWrites = 0
}

type uringBackend struct {
	t         *Tier
	s         *shard
	ring      *uring.Ring
	waker     *uring.Waker // a locked owner with a spare P, or with DEFER_TASKRUN but no TASKRUN_FLAG: an armed READ that ends a wait in io_uring_enter
	evfd      *os.File     // otherwise: the ring's registered eventfd, which the owner sleeps on in Go's netpoller
	evfdN     int          // evfd's descriptor, for wake (File.Fd would make it blocking)
	evraw     syscall.RawConn
	evread    func(fd uintptr) bool // reads the eventfd; false (EAGAIN) parks in the netpoller
	evbuf     [8]byte
	ns        *nsDirFD // the namespace directory; replaced when it goes (nsdir.go)
	direct    bool
	rw        uint8                // SQE flags for opens, reads and writes: SQEAsync where the filesystem may block inline
	chunk     uint32               // SQEs an owner queues before it submits them (submitChunk, or the SQ's size)
	yield     bool                 // the owner yields its P after each chunk it submits, while mayYield
	runnable  [1]metrics.Sample    // the runtime's count of runnable goroutines (mayYield)
	hdrLen    int                  // each program's header memory: ScratchSize (vectored loads) or HeaderSize
	framed    []int32              // by op: 1 + the tier buffer whose frame it holds (scratch), or 0
	progs     []blockstore.Program // op i's program; pinned: SQEs point into it until their CQEs
	dirFD     []int                // the namespace directory op i resolves its paths beneath, for all its phases
	await     []uint16             // op i's steps of its current phase without a result, a bit each
	sqEnd     []uint32             // the SQ position past op i's current phase (uring.Ring.Taken)
	pinner    runtime.Pinner
	hdrs      []byte // OpsMax header buffers of ScratchSize, mmap'd (aligned); registered buffer 0
	cqes      []uring.CQE
	next      []int32 // ops whose next phase is to be prepared
	doneQ     []int32 // finished ops not yet handed to the shard
	recancel  []int32 // pairs (op, step): canceled ops whose later steps a hard link started
	rearm     bool    // the waker fired: arm it again
	cfg       blockstore.Config
	cfgOpen   blockstore.Config // lookups by O_PATH open (LookupOpenPath, half of LookupMixed)
	uncached  int               // cached-first lookup opens that the dentry cache could not answer, less coldHit for each it did (at least 0)
	coldN     uint              // lookups started while uncached was coldRun or more: every coldProbe+1'th tries the cache (coldExit'th after probeHit)
	probeHit  bool              // while cold, the cache answered the latest probe
	broken    error             // the ring failed: ops fail with this, nothing more goes to the kernel
	wakeC     chan struct{}     // wake's token, for an owner asleep with nothing in the kernel
	timer     *time.Timer       // the owner's, for such sleeps
	onEventfd atomic.Bool       // the owner sleeps on the eventfd: wake must write it
	probed    []uint32          // slots a lookup's probe left a file in (blockstore.Step.Probe)
	isProbed  []bool            // by slot: in probed
	empty     []int32           // OpsMax times -1, to empty slots with
	queued    int               // bytes of the reads and writes queued since the last submission
	quiet     bool              // the ring signals its eventfd only while the owner sleeps on it (idle)
	remote    bool              // not EngineInfo.Inline, read at set-up (Open rewrites t.engine once the owners run): gatherWindow
	sumAside  int               // the payload from which a load is judged aside; 0: never
	aside     []uint8           // by op: asideJudging, asideCanceled (judgeAside), asidePool
	bare      []bool            // by op: a lookup's probe in flight, its program not started (prepareProbe)
	writesMu  sync.Mutex
	writesQ   []*ringWrite // guarded by writesMu: the store pool's writes, for takeWrites
	writesErr error        // guarded by writesMu: the ring broke; writes fail at once
	spareW    []*ringWrite
	writes    []*ringWrite // by slot: the store pool's writes on the ring
	nWrites   int          // of them, not nil
	pool      *syncPool    // the store pool (stores through the page cache; on tmpfs loads too): runs the ops pooled says with plain system calls; nil: all go to the ring
	nPooled   int          // of the shard's ops in use: those on the store pool
	asideMu   sync.Mutex
	verdicts  []verdict // Judges run aside, for the owner to take; under asideMu
	spareV    []verdict

	loaded     bool // the last ops the owner finished had a load among them (lingers)
	lingerMiss int  // lingers in a row that no wake ended (lingers)
	naps       int  // naps so far (lingers)
}

// verdict is what a Judge run aside returned for op i.
type verdict struct {
	i       int32
	decided bool
}

// An op's Judge runs aside (asideJudging): nothing but that goroutine
// touches its program. A cancel meanwhile is kept (asideCanceled) for
// the owner to apply once the verdict is in. An op on the store pool
// (asidePool) has nothing in the ring either; a cancel cannot reach its
// system calls, as on the sync engine.
const (
	asideJudging uint8 = 1 << iota
	asideCanceled
	asidePool
)

// A ring whose cached-first lookup opens have missed the dentry cache
// coldRun times more than coldHit times as often as the cache answered
// them (coldRun in a row: caches dropped, a tree never walked; the break-
// even of a miss, which costs the open and a STATX, against a hit, which
// saves a kernel worker, is near one hit in five) sends lookups to STATX at
// once, all but one in coldProbe+1, which tries the cache again. A probe
// that the cache answers brings the next one to coldExit lookups later,
// and if that one is answered too the cold run ends, halfway to the next.
// With caches dropped (BenchmarkLookupCold) the open that fails and the
// STATX after it answered 0.62-1.0 [0.66] of the keys a second of
// LookupStatx's locked owners (5 interleaved rounds); asking STATX at once
// from these owners made 1.06x (0.92-1.31) the keys a second of the open
// first (10 rounds). Until 2026-12-05 any probe or open that the cache
// answered ended the run, and the next coldRun opens that missed began
// another: as a cold run's walks fill the cache, one probe in ten or so
// found its path there, and BenchmarkLookupCold made 1.34 SQEs a key
// (1.07 now).
const (
	coldRun   = 64
	coldProbe = 15
	coldHit   = 4
	coldExit  = 4
)

// ringFault, when set (by tests), is asked before each submission, with
// the number of SQEs it hands over, and may return the error the kernel
// is to be taken to have returned.
var ringFault func(sqes uint32) error

// ringSize, when set (by tests), is the size of both queues of each ring,
// so that a test can fill them.
var ringSize uint32

// A phase's steps fit the bit sets of await and cqeSkips.
const _ = uint16(1<<blockstore.StepsMax - 1)

var _ backend = (*uringBackend)(nil)

// newURingBackend sets up shard s's ring, on its owner goroutine.
func newURingBackend(t *Tier, s *shard) (_ *uringBackend, err error) {
	n := t.opts.OpsMax
	// Room for several phases of every op (a load's first phase is five
	// SQEs) without submitting mid-way.
	entries := uint32(min(8192, max(64, 4*n)))
	b := &uringBackend{t: t, s: s, ns: t.ns, direct: t.engine.Direct,
		progs: make([]blockstore.Program, n), dirFD: make([]int, n), await: make([]uint16, n), sqEnd: make([]uint32, n), aside: make([]uint8, n), bare: make([]bool, n), framed: make([]int32, n),
		cqes: make([]uring.CQE, 256), wakeC: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	b.timer.Stop()
	b.hdrLen = blockstore.ScratchSize
	// With fewer rings than Ps, a caller finds a P whatever the owners
	// hold: an owner need not yield its P, and a locked one may sleep in
	// io_uring_enter.
	spareP := t.opts.Rings < runtime.GOMAXPROCS(0)
	b.chunk = submitChunk
	b.yield = !t.engine.OwnThreads && !spareP
	b.runnable[0].Name = "/sched/goroutines/runnable:goroutines"
	if spareP && t.engine.Inline {
		b.sumAside = sumAside // measured where the reads are copies on the owner's CPU
	}
	if sumAsideAll > 0 {
		b.sumAside = sumAsideAll
	}
	if t.engine.Inline && t.engine.OwnThreads {
		// A batch goes whole. STATX (or mixed) lookups on a local
		// filesystem: every STATX goes to a kernel worker and each
		// submission wakes workers, so chunks cost more than they hand
		// over sooner (BenchmarkLookup, 5 interleaved rounds, medians of
		// the per-round ratios of keys a second, whole against chunks:
		// STATX 1.08 with one ring (0.79-1.68), 0.95 with a ring per CPU
		// (0.72-1.33), mixed 1.75 (1.02-2.03)). Other owners hand over a
		// chunk at a time, even with a spare P and nothing to hand over
		// to: what completed inline is reaped, and its op slots go to the
		// next keys while their memory is in the CPU's cache (O_PATH
		// lookups on one ring of two CPUs, 1,024-key batches, 4
		// interleaved rounds: 1.18x (1.08-1.50) the keys a second of the
		// batch whole).
		b.chunk = entries
	}
	if !t.engine.Inline {
		b.rw = uring.SQEAsync
		// One READV of header, payload and past the end (a Program with
		// ScratchSize of header memory) meets the end of every block
		// file, and an asynchronous READV through FUSE that does may
		// report more than the file holds (12,288 bytes of an 8,192-byte
		// file; linux_test.TestLoadsThroughFUSE). With HeaderSize a load
		// reads past the end apart, then header and payload with one
		// READV: on GlusterFS, 2 interleaved runs of tierbench load
		// --rounds 3 on each volume, 1.24-1.29x the sync engine's keys a
		// second at 0.78-1.03x its CPU a load, against 1.02-1.21x at
		// 0.89-1.24x with a READ each for header and payload (each a
		// FUSE request, its completion task work for the owner, which
		// hands the next step to a kernel worker again).
		b.hdrLen = blockstore.HeaderSize
	}
	b.remote = !t.engine.Inline
	b.cfg = t.programConfig(dirSet{})
	b.cfg.AsyncDirectReads = t.engine.LastPageApart
	if b.sumAside > 0 {
		b.cfg.SumChunk = 0 // a big payload's checksum whole, on another CPU (sumAside)
	}
	b.cfgOpen = b.cfg
	b.cfgOpen.LookupByOpen = true
	b.cfgOpen.LookupCachedFirst = t.engine.Inline
	b.empty, b.isProbed = make([]int32, n), make([]bool, n)
	for i := range b.empty {
		b.empty[i] = -1
	}
	b.pinner.Pin(&b.progs[0])
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if t.engine.StoresSync || t.engine.LoadsSync {
		rings := t.opts.Rings
		var write func(w *ringWrite) int32
		if t.engine.Direct && !t.engine.LoadsSync {
			write = b.ringWrite // not on tmpfs: no IOCB_NOWAIT, every write to a kernel worker
		}
		b.pool = newSyncPool(t, s, (t.opts.SyncWorkers+rings-1)/rings, 1, b.wake, write)
	}
	cq := 8 * entries
	if ringSize > 0 {
		entries, cq = ringSize, ringSize
	}
	// On a local filesystem a submission never sleeps (Options.RawSubmit).
	// tierbench --engine uring, ext4 over a loop device, 4 interleaved
	// rounds against blocking enters: loads 1.13x the keys a second at
	// 0.80x the CPU a key, the Load call's p99.9 18-25 µs against 34-58.
	ropts := uring.Options{CQEntries: cq, RawSubmit: t.engine.Inline}
	if !t.engine.OwnThreads {
		// Any thread may submit, and completions run as task work in
		// the thread that submitted, interrupting it (no COOP_TASKRUN:
		// that thread may be asleep and never enter the kernel).
		ropts.Disable = uring.FlagSingleIssuer | uring.FlagDeferTaskrun | uring.FlagCoopTaskrun | uring.FlagTaskrunFlag
	}
	if !t.engine.Inline {
		// Every step goes to a kernel worker (SQEAsync). With
		// DEFER_TASKRUN a worker's completion is task work that only the
		// owner runs, and the owner then hands the chain's next step to
		// a worker again: a hand-off and a wake of the owner a step.
		// Without it the worker posts the completion itself and runs the
		// next step at once (linux_test TestChainsRunInOneWorker). On
		// GlusterFS, with caching off: 1.9 hand-offs a 64 KiB load
		// against 3.7, 1.0 a store against 3.0 (perf stat); 2 interleaved
		// runs of tierbench --rounds 3 on each volume, CPU a key ÷ the
		// sync engine's: loads 0.84-1.19 against 1.12-1.28, stores
		// 0.82-0.99 against 1.10-1.44; lookups, one step, unchanged.
		ropts.Disable |= uring.FlagDeferTaskrun
	}
	if b.ring, err = uring.New(entries, ropts); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if _, _, err = b.ring.SetIOWQMaxWorkers(uint32(t.opts.WorkersMax), uint32(t.opts.WorkersMax)); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if err = b.ring.RegisterFilesSparse(uint32(n)); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if b.hdrs, err = uring.AllocBuffer(n * blockstore.ScratchSize); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	if err = b.ring.RegisterBuffers(append([][]byte{b.hdrs}, t.frames...)); err != nil {
		if len(t.frames) > 0 && t.opts.BufferMemory != nil && (errors.Is(err, unix.EFAULT) || errors.Is(err, unix.EOPNOTSUPP)) &&
			b.ring.RegisterBuffers([][]byte{b.hdrs}) == nil {
			return nil, fmt.Errorf("%w: BufferMemory is memory the kernel does not register for io_uring (%v):"+
				" give anonymous or shared memory (mmap MAP_ANONYMOUS, a file in /dev/shm or hugetlbfs), not a mapping of a file on disk", ErrInvalidOptions, err)
		}
		return nil, fmt.Errorf("tier: %w", err)
	}
	if f := b.ring.Flags(); !t.engine.OwnThreads || !spareP && (f&uring.FlagDeferTaskrun == 0 || f&uring.FlagTaskrunFlag != 0) {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return nil, fmt.Errorf("tier: eventfd: %w", err)
		}
		b.evfd, b.evfdN = os.NewFile(uintptr(fd), "uringtier-ring"), fd
		if b.evraw, err = b.evfd.SyscallConn(); err != nil {
			return nil, fmt.Errorf("tier: %w", err)
		}
		// Through the raw connection: File.Read would wrap each deadline
		// in a new *PathError, an allocation per idle wait. A raw read,
		// as wake's write: neither blocks, and a system call through
		// the runtime's entersyscall made while every P was idle wakes
		// its sysmon, which then wakes every 20 µs for a millisecond or
		// more, each time taking some CPU from what ran there. Owners
		// of O_DIRECT loads sleep here with every P idle all the time
		// (BenchmarkCallerFloor/op=load/engine=uring, 2 runs: sysmon
		// slept 300-570 times a second against 5,500-5,600; 4 more
		// alternating: the longest call 83-170 µs against 162-307,
		// the Load calls' p99.9 39 µs against 67 at the median).
		b.evread = func(fd uintptr) bool {
			_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b.evbuf[0])), uintptr(len(b.evbuf)))
			return e != unix.EAGAIN
		}
		if err = b.ring.RegisterEventfd(fd); err != nil {
			return nil, fmt.Errorf("tier: %w", err)
		}
		b.quiet = b.ring.NotifyEventfd(false)
		return b, nil
	}
	if b.waker, err = uring.NewWaker(); err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	b.waker.Arm(b.sqe(), wakeUD)
	return b, nil
}

// sqe returns a free SQE, submitting what is queued when the SQ is full.
// Only for SQEs that link to nothing: a phase takes reserve first.
func (b *uringBackend) sqe() *uring.SQE {
	for {
		if s := b.ring.GetSQE(); s != nil {
			return s
		}
		b.submit()
	}
}

// reserve makes room for a whole phase (StepsMax SQEs) before it is
// prepared, so that its chain goes to the kernel in one submission.
func (b *uringBackend) reserve() {
	for b.broken == nil && b.ring.SQSpace() < blockstore.StepsMax {
		b.submit()
	}
}

// submit hands the queued SQEs to the kernel. When the kernel is busy it
// reaps completions first; handling them prepares nothing, so this is safe
// wherever SQEs are prepared.
func (b *uringBackend) submit() {
	for b.broken == nil {
		var err error
		if ringFault != nil {
			err = ringFault(b.ring.Pending())
		}
		if err == nil {
			_, err = b.ring.Submit()
		}
		if err == nil {
			b.queued = 0
			return
		}
		if !errors.Is(err, uring.ErrRetry) {
			b.fail(fmt.Errorf("io_uring_enter: %w", err))
			return
		}
		b.t.stats.retries.Add(1)
		b.reap()
	}
}

// fail gives up on the ring after an error it cannot recover from: every
// op not yet decided ends StatusFailed with ErrBroken and the cause, later
// ops fail at once, and the tier says so. Memory the kernel may still use
// is never freed: nor is a caller's buffer of a load or store whose phase
// the kernel took, which may still read or write it and which a broken
// ring never reaps (its Result counts it in Held, and no OpRelease
// follows).
func (b *uringBackend) fail(err error) {
	if b.broken != nil {
		return
	}
	b.broken = fmt.Errorf("%w: %w", ErrBroken, err)
	b.t.broke(b.broken)
	b.doneQ = b.doneQ[:0]
	for i := range b.s.ops {
		o := &b.s.ops[i]
		if !o.inUse || b.aside[i] != 0 {
			continue // takeVerdicts fails an op judged aside; the store pool finishes its own
		}
		if o.status == StatusPending {
			o.status, o.err = StatusFailed, b.broken
		}
		if o.buf != nil && b.await[i] != 0 && b.ring.Taken(b.sqEnd[i]) {
			b.t.hold(o.holder)
		}
		b.doneQ = append(b.doneQ, int32(i))
	}
	b.next, b.recancel, b.rearm = b.next[:0], b.recancel[:0], false
	clear(b.await)
	clear(b.bare)
	b.failWrites()
}

// ud is the user_data of op i's step.
func ud(i int32, step int) uint64 { return uint64(i)<<8 | uint64(step) }

// scratch is op i's header memory for Program.Start: for an O_DIRECT
// load into one of the tier's registered buffers, where its one read past
// the block's end is safe (hdrLen), the buffer's frame, unless another op
// has it (a caller that gave one buffer to two loads at once, against
// Load's rule, must not have one judge the other's header); else the
// op's own. BenchmarkLoad, a ring per CPU, fixture on ext4 over a
// memory-backed loop device, 3 interleaved rounds against the op's own:
// O_DIRECT 2 MiB 1.06-1.21x the keys a second at 0.71-0.82x the CPU a
// load, 256 KiB 1.07-1.08x at 0.88-0.92x; through the page cache 2 MiB
// 0.91-1.03x at 0.96-1.09x, 256 KiB 0.90-0.97x (copying into a registered
// buffer costs more than into an iovec, and pins nothing less). Not for
// a store: one buffer may be stored under two keys at once, and each
// needs a header of its own (TestStoreFromBuffers).
func (b *uringBackend) scratch(i int32, o *op) []byte {
	if o.kind == OpLoad && b.direct && aligned(o.buf) && b.hdrLen == blockstore.ScratchSize {
		if k, f := b.t.frame(o.buf); f != nil && b.t.frameBusy[k].CompareAndSwap(false, true) {
			b.framed[i] = int32(k) + 1
			return f
		}
	}
	return b.hdr(i)
}

// flushDone appends the ops in doneQ to done, the kernel being finished
// with them, and lets go of their frames.
func (b *uringBackend) flushDone(done []int32) []int32 {
	for _, i := range b.doneQ {
		if k := b.framed[i]; k != 0 {
			b.t.frameBusy[k-1].Store(false)
			b.framed[i] = 0
		}
	}
	if len(b.doneQ) > 0 {
		b.loaded = slices.ContainsFunc(b.doneQ, func(i int32) bool { return b.s.ops[i].kind == OpLoad })
	}
	done = append(done, b.doneQ...)
	b.doneQ = b.doneQ[:0]
	return done
}

func (b *uringBackend) hdr(i int32) []byte {
	off := int(i) * blockstore.ScratchSize
	return b.hdrs[off : off+b.hdrLen : off+b.hdrLen]
}

// bufIndex returns the registered buffer index of buf: 0 when it lies in
// the header buffers, k+1 within the tier's buffer k's frame (registered:
// allocBuffers), or -1.
func (b *uringBackend) bufIndex(buf []byte) int {
	if within(buf, b.hdrs) {
		return 0
	}
	k, off := b.t.bufferAt(buf)
	if k < 0 || len(b.t.frames) == 0 || off+len(buf) > (k+1)*b.t.bufStride {
		return -1 // not in a frame, or spans two
	}
	return k + 1
}

// within reports whether buf lies inside mem.
func within(buf, mem []byte) bool {
	if len(buf) == 0 || len(mem) == 0 {
		return false
	}
	base, p := uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&buf[0]))
	return p >= base && p+uintptr(len(buf)) <= base+uintptr(len(mem))
}

func (b *uringBackend) start(i int32, o *op, done []int32) []int32 {
	cfg := &b.cfg
	if b.t.opts.Lookup == LookupOpenPath || b.t.opts.Lookup == LookupMixed && i%2 == 0 {
		cfg = &b.cfgOpen
		if o.kind == OpLookup && b.uncached >= coldRun {
			// The dentry cache answered too few of the latest
			// lookups: ask STATX at once, and try the cache again now
			// and then.
			every := uint(coldProbe + 1)
			if b.probeHit {
				every = coldExit
			}
			if b.coldN++; b.coldN%every != 0 {
				cfg = &b.cfg
			}
		}
	}
	p := &b.progs[i]
	if b.broken != nil {
		o.status, o.err = StatusFailed, b.broken
		b.doneQ = append(b.doneQ, i)
	} else if b.pooled(o) {
		b.aside[i] = asidePool
		b.nPooled++
		if o.kind == OpStore {
			o.ringWrite = b.t.poolStores.Add(1) > ringWriteMin
		}
		b.pool.send(i)
	} else if path, how, ok := b.probe(p, cfg, o); ok {
		b.dirFD[i] = b.ns.currentAt(o.started)
		b.prepareProbe(i, path, how)
	} else if err := p.Start(cfg, programOp[o.kind], o.keyBytes(), o.buf, b.scratch(i, o), b.direct && aligned(o.buf)); err != nil {
		o.status, o.err = StatusFailed, err
		b.doneQ = append(b.doneQ, i)
	} else {
		b.dirFD[i] = b.ns.currentAt(o.started)
		b.prepare(i)
	}
	return b.flushDone(done)
}

// probe readies a lookup's program for its one open alone where cfg
// makes the lookup so (blockstore.Program.Probe): the open's result then
// decides most lookups without a program started and judged
// (probeEnded). BenchmarkLookupInterleaved, 8 runs each, the order
// alternating, medians: 0.77x the keys a second of the same open on bare
// rings (0.74-0.82) against 0.755x (0.73-0.78) with every lookup's
// program started and judged, at 1.37x their CPU a key (1.34-1.39)
// against 1.44x (1.40-1.48); 1.095x the sync engine's keys a second
// (1.08-1.11) against 1.03x (1.02-1.06).
func (b *uringBackend) probe(p *blockstore.Program, cfg *blockstore.Config, o *op) (*byte, *unix.OpenHow, bool) {
	if o.kind != OpLookup {
		return nil, nil, false
	}
	return p.Probe(cfg, o.keyBytes()) // declines b.cfg's lookups (STATX)
}

// prepareProbe queues op i's probe: the open of path with how into the
// op's slot.
func (b *uringBackend) prepareProbe(i int32, path *byte, how *unix.OpenHow) {
	b.reserve()
	if b.broken != nil {
		return // fail has decided the op
	}
	s := b.ring.GetSQE()
	s.PrepareOpenat2Direct(b.dirFD[i], path, how, uint32(i))
	s.UserData = ud(i, 0)
	b.await[i], b.sqEnd[i], b.bare[i] = 1, b.ring.SQTail(), true
	b.endChunk()
}

// probeEnded takes the result of op i's probe: the verdict, or, where the
// open alone does not decide, the program started with that result as its
// first step's, as if it had made the open itself.
func (b *uringBackend) probeEnded(i int32, res int32) {
	b.bare[i] = false
	o, p := &b.s.ops[i], &b.progs[i]
	if st, ok := blockstore.ProbeVerdict(res); ok {
		b.dentryAnswered()
		o.status, o.err = tierStatus[st], nil
		b.doneQ = append(b.doneQ, i)
		return
	}
	canceled := p.Canceled // a cancel of the probe holds for the program
	if err := p.Start(&b.cfgOpen, blockstore.OpLookup, o.keyBytes(), nil, b.scratch(i, o), false); err != nil {
		o.status, o.err = StatusFailed, err
		b.doneQ = append(b.doneQ, i)
		return
	}
	p.Canceled = canceled
	b.await[i] = 1
	if b.complete(i, 0, res) {
		b.evaluate(i)
	}
}

// prepare queues op i's current phase, one SQE per step, as one
// submission's worth of linked SQEs.
func (b *uringBackend) prepare(i int32) {
	b.reserve()
	if b.broken != nil {
		return // fail has decided the op
	}
	p, dir, slot := &b.progs[i], b.dirFD[i], uint32(i)
	skips := cqeSkips(p)
	for k := range p.N {
		st := &p.Steps[k]
		s := b.ring.GetSQE()
		if s == nil {
			b.fail(fmt.Errorf("SQ full inside a reserved phase (op %d, step %d)", i, k))
			return
		}
		switch st.Op {
		case blockstore.StepStatx:
			s.PrepareStatx(dir, st.Path, unix.AT_STATX_DONT_SYNC|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_SIZE, &p.Stx)
		case blockstore.StepOpen:
			if st.Keep {
				// An ordinary descriptor: UNLINKAT and RENAMEAT take no
				// fixed file.
				s.PrepareOpenat2(dir, st.Path, st.How)
				break
			}
			s.PrepareOpenat2Direct(dir, st.Path, st.How, slot)
			if st.How.Flags&unix.O_PATH == 0 {
				// An O_RDONLY open calls the filesystem's open (FUSE_OPEN, an
				// NFSv4 OPEN), which may block like a read.
				s.Flags |= b.rw
			}
		case blockstore.StepRead, blockstore.StepWrite:
			b.prepareRW(s, st, slot)
			b.queued += len(st.Buf)
		case blockstore.StepReadv:
			s.PrepareReadv(int(slot), st.Vec, uint64(st.Off))
			s.Flags |= uring.SQEFixedFile | b.rw
			b.queued += int(st.VecLen())
		case blockstore.StepWritev:
			s.PrepareWritev(int(slot), st.Vec, uint64(st.Off))
			s.Flags |= uring.SQEFixedFile | b.rw
			b.queued += int(st.VecLen())
		case blockstore.StepFsync:
			s.PrepareFsync(int(slot), st.Data)
			s.Flags |= uring.SQEFixedFile
		case blockstore.StepClose:
			if st.Keep {
				s.PrepareClose(p.DirFD)
				break
			}
			s.PrepareCloseDirect(slot)
		case blockstore.StepMkdir:
			s.PrepareMkdirat(dir, st.Path, 0o755)
		case blockstore.StepRename:
			from, to := st.At(p, dir), st.At(p, dir)
			if st.Abs2 {
				to = unix.AT_FDCWD
			}
			s.PrepareRenameat(from, st.Path, to, st.Path2, 0)
		case blockstore.StepUnlink:
			s.PrepareUnlinkat(st.At(p, dir), st.Path, 0)
		}
		switch st.Link {
		case blockstore.LinkOnSuccess:
			s.Flags |= uring.SQEIOLink
		case blockstore.LinkAlways:
			s.Flags |= uring.SQEIOHardlink
		}
		if skips&(1<<k) != 0 {
			s.Flags |= uring.SQECQESkipSuccess
		}
		s.UserData = ud(i, k)
	}
	b.await[i], b.sqEnd[i] = 1<<p.N-1, b.ring.SQTail()
	b.endChunk()
}

// endChunk submits what is queued once it makes a chunk (b.chunk SQEs,
// or submitBytes of reads and writes).
func (b *uringBackend) endChunk() {
	if b.ring.Pending() >= b.chunk || b.queued >= submitBytes {
		// Inline opens and page-cache copies run in io_uring_enter,
		// holding the owner's P: hand over what is queued now, at the
		// end of a phase, judge what completed while its bytes are still
		// in the CPU's cache (a load's checksum), and, where the owners
		// may hold every P, let a goroutine that waits for it (the
		// caller's) have it (mayYield). Not an
		// owner locked to its thread: its goroutine runs on no other, so
		// yielding costs two thread switches (STATX lookups, one ring:
		// 145,000 futex calls against 37,000 without, and 1.2-1.4x the
		// keys a second).
		b.submit()
		b.reap()
		if b.mayYield() {
			if ownerYields != nil {
				ownerYields(b.s)
			}
			runtime.Gosched()
			// Back from the run queue, often on another thread: one the
			// runtime woke for the other P, and that this VM's kernel ran
			// on the caller's CPU, holding that caller off for 0.5-1.6 ms
			// while this owner's path walks ran there (tierbench --trace
			// of lookups: the Poll that the yield let run made no
			// progress until this owner slept). A yield of the thread
			// lets that caller finish first.
			// tierbench lookup --rounds 2, 12 runs alternating: calls over
			// 1 ms in 1 of 24 rounds against 7, over 300 us 6 against 18;
			// BenchmarkCallerFloor/engine=uring, 4 rounds: the longest
			// call 178-299 us against 283-1,163; warm lookups alike.
			unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
}

// mayYield reports whether the owner yields its P after a chunk: when a
// goroutine waits for one (a caller it readied, one back from a system
// call or a C caller entering Go). A yield with none waiting and a P idle
// only had the runtime wake a thread for that P (its wakep: a futex call
// and an interrupt to the other CPU), which found nothing to run or took
// this owner to its CPU. The runtime's count of runnable goroutines costs
// a read of 60 ns here. BenchmarkCallerFloor, 7 rounds alternating with
// yields after every chunk, medians: op=idle's Lookup call 8.8 us against
// 11.4 at the p50, 63 against 106 at the p99.9, with a third of the IPIs;
// engine=uring's calls 37 against 41 us at the p99.9, its Lookup calls 56
// against 106; BenchmarkLookup 0.90-1.10x the keys a second (4 rounds).
func (b *uringBackend) mayYield() bool {
	if !b.yield {
		return false
	}
	metrics.Read(b.runnable[:])
	return b.runnable[0].Value.Uint64() > 0
}

// ownerYields, when set (by tests), is called on the owner's goroutine
// before each yield of its P.
var ownerYields func(s *shard)

// An owner submits what it has queued once it holds submitChunk SQEs (an
// owner of STATX lookups on a local filesystem: an SQ full) or reads and
// writes of submitBytes.
const (
	submitChunk = 32
	submitBytes = 1 << 20
)

// prepareRW prepares a read or write of the op's file, from a registered
// buffer where the memory is one.
func (b *uringBackend) prepareRW(s *uring.SQE, st *blockstore.Step, slot uint32) {
	k, off := b.bufIndex(st.Buf), uint64(st.Off)
	switch {
	case st.Op == blockstore.StepRead && k >= 0:
		s.PrepareReadFixed(int(slot), st.Buf, off, uint16(k))
	case st.Op == blockstore.StepRead:
		s.PrepareRead(int(slot), st.Buf, off)
	case k >= 0:
		s.PrepareWriteFixed(int(slot), st.Buf, off, uint16(k))
	default:
		s.PrepareWrite(int(slot), st.Buf, off)
	}
	s.Flags |= uring.SQEFixedFile | b.rw
}

func (b *uringBackend) cancel(i int32, o *op) {
	if b.aside[i] != 0 {
		b.aside[i] |= asideCanceled // nothing of it is in the kernel
		return
	}
	b.progs[i].Canceled = true
	if b.broken != nil {
		return
	}
	b.cancelFrom(i, 0)
}

// cancelFrom asks the kernel to cancel op i's steps from step k on. An op
// judged aside since a recancel was queued has nothing in the kernel, and
// its program is not the owner's to read.
func (b *uringBackend) cancelFrom(i int32, k int) {
	if b.aside[i] != 0 {
		return
	}
	for ; k < b.progs[i].N; k++ {
		s := b.sqe()
		s.PrepareCancel(ud(i, k), 0)
		s.UserData = cancelUD
	}
}

// wake wakes the owner: a token on wakeC, which is all an owner with
// nothing in the kernel waits for, and the eventfd (or the waker) only when
// the owner sleeps on it, since writing it is a system call and a netpoller
// wake-up.
func (b *uringBackend) wake() {
	select {
	case b.wakeC <- struct{}{}:
	default:
	}
	switch {
	case b.evfd == nil:
		b.waker.Wake()
	case b.onEventfd.Load():
		// The owner set onEventfd before it last looked at wakeC, so
		// either it saw the token or it sees the eventfd.
		uring.SignalEventfd(b.evfdN) // EAGAIN: the counter is full, the owner wakes anyway
	}
}

func (b *uringBackend) wakeCalls() bool { return b.evfd == nil || b.onEventfd.Load() }

// sleepsOnKernel: idle sleeps on the eventfd only with ops in the kernel.
func (b *uringBackend) sleepsOnKernel() bool { return b.evfd == nil || b.inKernel() }

// inKernel reports whether the kernel holds ops of this owner: one in use
// that is not on the store pool, or a write of the pool's on the ring.
func (b *uringBackend) inKernel() bool { return b.s.inUse > b.nPooled || b.nWrites > 0 }

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
	case c.UserData&writeUD != 0:
		k := int(c.UserData &^ writeUD)
		if b.broken != nil {
			return // failWrites answered it
		}
		if k >= len(b.writes) || b.writes[k] == nil {
			b.fail(fmt.Errorf("completion for the store pool's write %d, not one in flight", k))
			return
		}
		b.writes[k].res <- c.Res // its worker's, with room for it
		b.writes[k] = nil
		b.nWrites--
		return
	}
	i, step := int32(c.UserData>>8), int(c.UserData&0xff)
	if b.broken != nil {
		return
	}
	// await holds a bit for each step of the current phase still without
	// a result (none beyond its N), and none for an op judged aside,
	// whose program is not the owner's to read.
	if int(i) >= len(b.progs) || b.await[i]&(1<<step) == 0 || !b.s.ops[i].inUse {
		b.fail(fmt.Errorf("completion for op %d step %d, not a step in flight", i, step))
		return
	}
	if b.bare[i] {
		b.probeEnded(i, c.Res)
		return
	}
	p := &b.progs[i]
	switch {
	case b.complete(i, step, c.Res):
		b.evaluate(i)
	case p.Canceled && step+1 < p.N:
		// A hard link started the next step after the canceled one, and
		// the kernel could not cancel a step that had not started: ask
		// again for what follows, once the batch is handled.
		b.recancel = append(b.recancel, i, int32(step+1))
	}
}

// cqeSkips returns the steps of p's phase that post no completion when
// they succeed (IOSQE_CQE_SKIP_SUCCESS): every LinkOnSuccess step. A
// whole store is then one completion (its RENAME) instead of four, and
// one wake of the owner from the kernel worker that ran it. Such a step
// that fails posts its completion, and the kernel posts none for the rest
// of its chain, which it cancels (complete fills them in). A LinkAlways
// step posts its own (its failure cancels nothing), and so does the last
// step of a chain.
func cqeSkips(p *blockstore.Program) uint16 {
	var skips uint16
	for k := range p.N {
		if p.Steps[k].Link == blockstore.LinkOnSuccess {
			skips |= 1 << k
		}
	}
	return skips
}

// complete records step k's result res, and what it implies for the steps
// of its chain that skip their completions: before k, they succeeded (the
// chain went on to k); after k, if k skips its completion on success (so
// it failed), the kernel canceled them and posts nothing for them. It
// reports whether op i's phase has every result.
func (b *uringBackend) complete(i int32, k int, res int32) bool {
	p := &b.progs[i]
	p.Steps[k].Res = res
	b.await[i] &^= 1 << k
	skips := cqeSkips(p)
	if skips == 0 {
		return b.await[i] == 0
	}
	first, last := k, k
	for first > 0 && p.Steps[first-1].Link != blockstore.LinkNone {
		first--
	}
	for p.Steps[last].Link != blockstore.LinkNone {
		last++
	}
	for m := first; m < k; m++ {
		if skips&b.await[i]&(1<<m) != 0 {
			p.Steps[m].Res = int32(p.Steps[m].Asked())
			b.await[i] &^= 1 << m
		}
	}
	if skips&(1<<k) != 0 {
		for m := k + 1; m <= last; m++ {
			p.Steps[m].Res = -int32(unix.ECANCELED)
			b.await[i] &^= 1 << m
		}
	}
	return b.await[i] == 0
}

// evaluate judges op i's finished phase: its outcome goes to doneQ, or its
// next phase to next.
func (b *uringBackend) evaluate(i int32) {
	p := &b.progs[i]
	if b.sumAside > 0 && p.Sums() >= b.sumAside {
		b.aside[i] = asideJudging
		b.s.aside++
		go b.judgeAside(i)
		return
	}
	b.judged(i, p.Judge())
}

// sumAside is the payload from which a load's Judge runs on a goroutine
// of its own, on an owner with a spare P on a local filesystem: its
// checksum costs about what the kernel's copy of the payload cost the
// owner, and the next copies no longer wait behind it. Page-cache loads on
// one ring of 2 CPUs, judged aside against on the owner, with blockstore's
// VPCLMULQDQ checksum (tierbench load --rings 1 --direct=false --depth 4
// --batch 1, interleaved rounds): 8 MiB 1.12-1.45x the bytes a second at
// 1.06-1.25x the CPU a load (3 rounds); 4 MiB 0.97-1.05x at 1.5x the CPU
// (4); 2 MiB 0.79-0.83x at 1.6x (3; BenchmarkLoad, 4 rounds: 0.82-0.92x).
// The hand-over costs more than a checksum of 4 MiB; with hash/crc32's,
// 2.2x slower, 2 MiB ones were 1.15x aside.
var sumAside = 8 << 20

// sumAsideAll, when set (by tests), is sumAside for every ring, spare P or
// not; asideStarted is called on the goroutine of each Judge run aside,
// before it.
var (
	sumAsideAll  int
	asideStarted func()
)

// judgeAside runs op i's Judge and hands the verdict to the owner. The
// wake is under asideMu: an owner that took the verdict, and so may
// close the backend, comes after it.
func (b *uringBackend) judgeAside(i int32) {
	if asideStarted != nil {
		asideStarted()
	}
	v := verdict{i, b.progs[i].Judge()}
	b.asideMu.Lock()
	b.verdicts = append(b.verdicts, v)
	b.wake()
	b.asideMu.Unlock()
}

// takeVerdicts takes what the Judges run aside decided: an outcome, or a
// next phase, which a cancel that came meanwhile reaches before it is
// prepared.
func (b *uringBackend) takeVerdicts() {
	if b.s.aside == 0 {
		return
	}
	b.asideMu.Lock()
	vs := b.verdicts
	b.verdicts = b.spareV[:0]
	b.asideMu.Unlock()
	for _, v := range vs {
		canceled := b.aside[v.i]&asideCanceled != 0
		b.aside[v.i] = 0
		b.s.aside--
		switch {
		case b.broken != nil && !v.decided:
			o := &b.s.ops[v.i]
			o.status, o.err = StatusFailed, b.broken
			b.doneQ = append(b.doneQ, v.i)
		case canceled && !v.decided:
			b.progs[v.i].Canceled = true
			fallthrough
		default:
			b.judged(v.i, v.decided)
		}
	}
	b.spareV = vs[:0]
}

// judged takes op i's verdict: its outcome to doneQ, or its next phase
// to next.
func (b *uringBackend) judged(i int32, decided bool) {
	p := &b.progs[i]
	if !decided {
		if p.Walking() {
			if b.uncached++; b.uncached > coldRun {
				b.probeHit = false // a probe missed
			}
		}
		if p.Renew {
			// A store found a directory gone: perhaps the namespace
			// directory itself (a few blocking calls, only then).
			p.Renew = false
			b.dirFD[i] = b.ns.renew(b.dirFD[i])
		}
		b.next = append(b.next, i)
		return
	}
	if p.Op == blockstore.OpLookup && p.Steps[0].Probe {
		b.dentryAnswered()
	}
	o := &b.s.ops[i]
	o.status, o.err = tierStatus[p.Status], p.Err
	if p.Steps[0].Probe && p.Steps[0].Res >= 0 && !b.isProbed[i] {
		b.probed = append(b.probed, uint32(i))
		b.isProbed[i] = true
	}
	b.t.noteDisposal(p)
	b.doneQ = append(b.doneQ, i)
}

// dentryAnswered counts a lookup open that the dentry cache answered
// (coldRun).
func (b *uringBackend) dentryAnswered() {
	switch {
	case b.uncached < coldRun:
		b.uncached = max(0, b.uncached-coldHit)
	case !b.probeHit:
		b.probeHit = true // a probe: try again soon
	default:
		b.uncached, b.probeHit = coldRun/2, false // two in a row: the run is over
	}
}

// wait submits what is queued and collects finished ops, blocking for at
// most d when nothing has finished. The owner sleeps on the ring's eventfd
// in Go's netpoller, where it holds no P (an owner asleep in
// io_uring_enter held its P, and a caller it woke waited for sysmon). The
// eventfd announces completions, deferred task work (which the submit
// after it runs) and wake. A locked owner with fewer rings than Ps, or on a
// kernel without DEFER_TASKRUN, submits, runs task work and waits in one
// io_uring_enter: STATX lookups on one ring of two CPUs, 1,024-key batches,
// 4 interleaved rounds, made 0.95 (0.77-1.17) of the keys a second of the
// engine's first design through the netpoller and 1.11 (0.93-1.25) so; a
// round trip of 8 keys took 98-146 µs and 84-106 µs (first design: 69-112).
// SQEs that the reaped completions queue go with the next wait.
//
// With a ring per CPU, STATX lookups keep kernel workers on both CPUs, and
// each wake-up through the netpoller waits for a CPU twice (the
// netpoller's thread, then the owner's own): BenchmarkLookup left the CPUs
// 14-15% idle (vmstat; the first design 3-4%), each ring had nothing in
// the kernel 15% of the time, and a caller's wake took 190 µs at the mean
// to reach an owner so asleep; 0.84-1.02 of the first design's keys a
// second on two rings. Sleeping in io_uring_enter instead, holding the P,
// made 0.94-1.10 of it, but a round trip of 8 keys took 184-191 µs
// against 106-123 (BenchmarkLookupRoundTrip, uring-statx/rings=cpus);
// sleeping there only while ops were in the kernel and no result had been
// handed over since made 0.80-1.07. Neither is kept.
func (b *uringBackend) wait(d time.Duration, done []int32) []int32 {
	b.takePooled()
	if b.pool != nil && b.pool.write != nil && b.broken == nil {
		b.takeWrites()
	}
	if b.broken == nil {
		// Phases that a submit in prepare reaped (its completions came
		// inline) go with this submit: left for the end, they waited
		// out the sleep below, up to lazyWake, with nothing in the
		// kernel to end it.
		b.prepareNext()
	}
	switch {
	case b.broken != nil:
		if len(b.doneQ) == 0 {
			b.idle(d)
		}
	case len(b.doneQ) > 0 || b.ring.Ready() > 0:
		b.submit()
	case b.evfd != nil:
		b.submit()
		if b.broken == nil && b.ring.Ready() == 0 && !b.ring.NeedsEnter() {
			if len(b.probed) > 0 && b.s.inUse == 0 && d > probeLinger {
				// Under load the next batch's opens replace the probes'
				// files; only a ring left idle empties its slots.
				if b.idle(probeLinger) {
					b.submit()
					break
				}
				b.emptyProbed()
				d -= probeLinger
			}
			b.idle(d)
			b.submit()
		}
	default:
		b.emptyProbed()
		d = max(d, time.Microsecond)
		if w := b.gatherWindow(); w > 0 {
			// In the kernel, which wakes the owner only once all have
			// completed or the window has passed; a caller's wake (the
			// waker's completion) waits for the window too.
			w = min(d, w)
			b.enter(uint32(b.awaited()), w)
			if b.ring.Ready() > 0 || d <= w {
				break
			}
			d -= w
		}
		if b.inKernel() {
			b.s.counts.sleeps.Add(1) // not an idle owner's sleep (Stats.KernelSleeps)
		}
		b.enter(1, d)
	}
	if b.broken == nil {
		b.reap()
	}
	b.takeVerdicts()
	b.takePooled()
	if b.broken == nil {
		b.prepareNext()
	}
	return b.flushDone(done)
}

// pooled reports whether op o runs on the store pool: every store with
// EngineInfo.StoresSync (not Options.StoresOnRing), and on tmpfs every
// load (EngineInfo.LoadsSync).
func (b *uringBackend) pooled(o *op) bool {
	switch {
	case b.pool == nil:
		return false
	case o.kind == OpLoad:
		return b.t.engine.LoadsSync
	case o.kind == OpStore:
		return b.t.engine.StoresSync
	}
	return false
}

// takePooled takes the ops that the store pool has finished.
func (b *uringBackend) takePooled() {
	if b.pool == nil {
		return
	}
	n := len(b.doneQ)
	b.doneQ = b.pool.finished(b.doneQ)
	for _, i := range b.doneQ[n:] {
		b.aside[i] = 0
		if b.s.ops[i].kind == OpStore {
			b.t.poolStores.Add(-1)
		}
	}
	b.nPooled -= len(b.doneQ) - n
}

// probeLinger is how long an owner with nothing in flight waits before it
// empties the slots its lookups' probes left files in.
const probeLinger = 10 * time.Millisecond

// emptyProbed closes the files that lookups' probes left in their slots,
// once no op is in flight: an O_PATH file keeps its inode, and a block
// removed since (evicted) would keep its disk space while the slot holds it.
// Busy, a ring holds at most OpsMax of them, each until its slot's next
// open replaces it.
func (b *uringBackend) emptyProbed() {
	if len(b.probed) == 0 || b.s.inUse > 0 {
		return
	}
	slices.Sort(b.probed)
	for _, i := range b.probed {
		b.isProbed[i] = false
	}
	for k := 0; k < len(b.probed); {
		run := 1
		for k+run < len(b.probed) && b.probed[k+run] == b.probed[k+run-1]+1 {
			run++
		}
		first, last := b.probed[k], b.probed[k+run-1]
		if err := b.ring.UpdateFiles(first, b.empty[:last-first+1]); err != nil {
			b.fail(err)
			return
		}
		k += run
	}
	b.probed = b.probed[:0]
}

// idle sleeps for at most d or until woken, and says whether it was. With nothing in the kernel
// (no op in use but on the store pool, whose workers wake the owner when
// they finish one, and none of its writes on the ring; or no eventfd: a
// broken ring), nothing but wake can end the sleep, and
// the owner waits on a channel like any goroutine; otherwise it waits on
// the ring's eventfd as well: a caller's wake is then a
// channel send, not an eventfd write (64 KiB loads from the page cache,
// one key a request: the caller's time per key fell from 5.0–5.4 to
// 0.9–1.5 µs, and a round trip of 8 lookups from 28–33 to 17–18 µs).
func (b *uringBackend) idle(d time.Duration) (woken bool) {
	d = max(d, time.Microsecond)
	if !b.inKernel() || b.evfd == nil {
		return b.nap(d)
	}
	if w := b.gatherWindow(); w > 0 {
		// Its signals off, the ring wakes no one as completions come:
		// the owner sleeps on its channel, where a caller's wake still
		// ends the sleep at once, and then reaps what gathered.
		w = min(d, w)
		if b.nap(w) || b.ring.Ready() > 0 || b.ring.NeedsEnter() || d <= w {
			return true
		}
		d -= w
	}
	b.s.counts.sleeps.Add(1)
	b.onEventfd.Store(true)
	if b.quiet {
		// Signals are off while the owner runs: it reaps what completes
		// inline itself, and each signal woke the netpoller's thread,
		// which took a CPU from the caller (BenchmarkCallerFloor, 8
		// interleaved runs: the caller's 20 µs spins had a p99.9 of
		// 79-101 µs, against 89-2,589 µs with signals always on, two of
		// the runs above 1.5 ms). On before the sleep, and the CQ looked
		// at again: a completion posted just before was not signalled.
		// Nothing here relies on how the kernel orders its read of the
		// flag with its post: a signal lost to that costs at most
		// quietMax, which bounds the sleep.
		b.ring.NotifyEventfd(true)
		defer b.ring.NotifyEventfd(false)
		if b.ring.Ready() > 0 || b.ring.NeedsEnter() {
			b.onEventfd.Store(false)
			return true
		}
		d = min(d, quietMax)
	}
	select {
	case <-b.wakeC:
		woken = true
	default:
		b.evfd.SetReadDeadline(time.Now().Add(d))
		err := b.evraw.Read(b.evread) // a deadline passing is no error; what woke it is in the ring
		if eventfdSlept != nil {
			eventfdSlept(b.s, errors.Is(err, os.ErrDeadlineExceeded))
		}
		woken = true // or the kernel did: either way, look
	}
	b.onEventfd.Store(false)
	return woken
}

// nap sleeps on the owner's channel for at most d, lingering first while
// lingers says so, and says whether a wake ended the sleep.
func (b *uringBackend) nap(d time.Duration) (woken bool) {
	if b.yield && b.lingers() {
		woken := b.linger(min(d, lingerMax))
		if ownerLingered != nil {
			ownerLingered(b.s, woken)
		}
		if woken {
			b.lingerMiss = 0
			return true
		}
		b.lingerMiss++
	}
	b.timer.Reset(d)
	select {
	case <-b.wakeC:
		woken = true
	case <-b.timer.C:
	}
	b.timer.Stop()
	return woken
}

// linger keeps the owner's P for at most d, handing it to any goroutine
// that waits for one (runtime.Gosched), and reports whether a wake came
// meanwhile. An owner that has answered loads lingers before it parks:
// the caller it answered, readied on this P, runs its Poll and
// its next Load at the Gosched, and the wake that Load makes is a channel
// send to an owner still running, not a parked goroutine's wake-up.
// BenchmarkLoad through the page cache (64 KiB, one key a request, 4 in
// flight), each figure a second of the same run, parked against lingering:
// the CPUs 65-70% busy against 97-99% (/proc/stat), 25,300 context
// switches against 2,200, 2,030 of the runtime's sleeps before stealing a
// goroutine another P readied (runqgrab's usleep) against 210,
// 2,360 futex calls against 160; 83,000 keys a second against 116,000.
// Not after lookups or stores alone: lingering after lookups too, warm
// lookups (BenchmarkLookup, a ring per CPU) came out at 1.02 M keys a
// second against 0.97 M at the median of 12 runs alternating, and 0.87 M
// against 0.93 M in 5 more (docs/performance.md, 2026-12-07, second
// sitting): within this VM's drift.
func (b *uringBackend) linger(d time.Duration) (woken bool) {
	end := time.Now().Add(d)
	for {
		select {
		case <-b.wakeC:
			return true
		default:
		}
		if !time.Now().Before(end) {
			return false
		}
		runtime.Gosched()
	}
}

// lingers reports whether the owner lingers before its next nap: after
// ops among which was a load, unless its last lingerMisses lingers ended
// with no wake, and then every lingerProbe'th nap, to find out whether
// they would again. A caller that loads now and then costs an owner a
// linger's CPU in one nap of lingerProbe (TestOwnersLingerWhileAsked).
func (b *uringBackend) lingers() bool {
	b.naps++
	return b.loaded && (b.lingerMiss < lingerMisses || b.naps%lingerProbe == 0)
}

// eventfdSlept, when set (by tests), is called on the owner's goroutine
// after each sleep on its ring's eventfd, with whether the sleep's bound
// ended it.
var eventfdSlept func(s *shard, bounded bool)

// ownerLingered, when set (by tests), is called on the owner's goroutine
// after each linger, with whether a wake ended it.
var ownerLingered func(s *shard, woken bool)

// How long an owner lingers at most, and when it stops (lingers).
// lingerMax is a variable for TestOwnersLingerWhileAsked, which lengthens
// it under the race detector.
var lingerMax = 20 * time.Microsecond

const (
	lingerMisses = 2
	lingerProbe  = 16
)

// gatherWindow is how long an owner about to sleep on the kernel first
// lets completions gather, or 0: on a ring whose every op goes to a kernel
// worker (a FUSE, NFS or unknown filesystem), with at least gatherOps
// completions awaited, its ops taking gatherOpTime or more at the moving
// average. Long enough to hold two completions at the rate that the ops
// awaited and their time imply, at most an eighth of that time and
// gatherMax (an owner awaiting completions wakes every lazyWake anyway).
// Each completion the eventfd announces wakes the netpoller's thread from
// a kernel worker on another CPU; a window ends on the owner's own timer
// (or, in io_uring_enter, when all have completed). On GlusterFS, tierbench
// run --batch lookup=128 --rounds 3, 3 runs on each volume alternating
// with the code before, CPU a key ÷ the sync engine's (caching off; on):
// lookups 0.70-0.87 and 0.76-0.83 against 0.98-1.16 and 1.02-1.30, loads
// 0.59-0.60 and 0.58-0.70 against 0.83-0.88 and 0.99-1.06, stores
// 0.74-0.87 and 0.61-0.70 against 0.96-1.09 and 0.78-0.83, keys a second
// as high or higher. perf stat of lookups with a fixed 200 µs window: 1.2-1.4
// epoll waits a key against 1.9-2.0, 180-185 µs of CPU against 228-233.
func (b *uringBackend) gatherWindow() time.Duration {
	n, t := b.awaited(), b.s.opTime
	// On the eventfd, only with its signals off while the owner is awake
	// (quiet): otherwise each completion wakes the netpoller anyway.
	if !b.remote || b.evfd != nil && !b.quiet || b.broken != nil || n < gatherOps || t < gatherOpTime {
		return 0
	}
	return max(gatherMin, min(2*t/time.Duration(n), t/8, gatherMax))
}

const (
	gatherMin    = 200 * time.Microsecond
	gatherMax    = lazyWake
	gatherOpTime = 8 * time.Millisecond
	gatherOps    = 8
)

// awaited is how many completions the owner awaits: its ops in use but
// those on the store pool and those stuck past their deadline, and the
// pool's writes on the ring.
func (b *uringBackend) awaited() int { return b.s.inUse - b.nPooled - b.s.stuck + b.nWrites }

// enter submits and waits for n completions or d.
func (b *uringBackend) enter(n uint32, d time.Duration) {
	if _, err := b.ring.SubmitAndWait(n, d); err != nil && !errors.Is(err, uring.ErrRetry) {
		b.fail(fmt.Errorf("io_uring_enter: %w", err))
	}
}

// quietMax bounds an owner's sleep on the eventfd with signals toggled:
// what a signal lost between turning them on and sleeping can cost.
const quietMax = 100 * time.Millisecond

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
				b.prepare(i)
			}
			if b.next == nil {
				b.next = next[:0]
			}
		}
	}
}

// brokenKept holds the backends of broken rings (close).
var brokenKept struct {
	sync.Mutex
	l []*uringBackend
}

// close releases the ring and everything the kernel could reference. The
// shard calls it only once no op is in flight.
func (b *uringBackend) close() {
	if b.pool != nil {
		b.pool.close()
	}
	if b.broken != nil {
		// The kernel may still write into the programs and buffers of
		// the ops it had, and resolve paths against the namespace
		// directory's fds: keep them, and close only the ring's. Kept
		// for the process's life, the programs still pinned: a backend
		// left to the garbage collector would free what the kernel may
		// write, and its pinner's finalizer panics.
		b.ring.Close()
		if b.evfd != nil {
			b.evfd.Close()
		}
		b.ns.release(true)
		brokenKept.Lock()
		brokenKept.l = append(brokenKept.l, b)
		brokenKept.Unlock()
		return
	}
	if b.ring != nil {
		b.ring.Close()
	}
	if b.waker != nil {
		b.waker.Close()
	}
	if b.evfd != nil {
		b.evfd.Close()
	}
	if b.hdrs != nil {
		uring.FreeBuffer(b.hdrs)
	}
	b.ns.release(false)
	b.pinner.Unpin()
}
