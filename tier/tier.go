package tier

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/uring"
)

// Tier is an asynchronous block store over one namespace directory. Its
// methods are safe for concurrent use; none blocks on IO.
type Tier struct {
	opts      Options           // validated, defaults applied; immutable after Open
	store     *blockstore.Store // the synchronous store: layout, sync engine, maintenance
	nsDir     string            // <root>/<namespace>, absolute
	qDir      string            // where corrupt blocks found by loads go
	engine    EngineInfo        // immutable after Open
	local     bool              // the filesystem is local (inlineSafe); immutable after Open
	log       *slog.Logger      // Options.Logger, or a silent one; immutable
	seed      maphash.Seed      // key hashing; immutable
	shards    []*shard          // one per ring (one for the sync engine); immutable after Open
	ns        *nsDirFD          // the namespace directory, shared by the shards' backends
	ready     chan struct{}     // capacity 1: results are waiting
	buffers   [][]byte          // aligned buffers offered to callers; immutable after Open
	bufMem    []byte            // the memory behind buffers (mapped by Open, or Options.BufferMemory); nil after Close
	bufStride int               // distance between buffers in bufMem
	frames    [][]byte          // each buffer's frame (frame), which the io_uring engine registers; none if too large
	frameBusy []atomic.Bool     // by frame: an io_uring op reads into it
	bufHome   []atomic.Uint32   // by buffer: 1 + the shard its last load went to (dealLoad)

	calls sync.WaitGroup // submits and cancels between their closed check and their hand-over to shards
	// closed: Close was called. Set under mu, so that a check under mu
	// orders a submit or cancel against Close; read without it where a
	// stale false costs nothing (a later check under mu follows).
	closed atomic.Bool

	mu       sync.Mutex       // guards everything below
	reqs     []request        // request slots, len Depth
	free     []int32          // free request slots
	byID     map[uint64]int32 // request ID -> slot, for requests not yet polled
	done     []doneEntry      // finished requests waiting for Poll
	closeErr error            // Close's result, for a second Close
	closeCh  chan struct{}    // closed when the first Close has finished

	stats      statsCounters         // atomic; see stats.go
	cap        capacity              // atomic; see capacity.go
	cacheEpoch atomic.Uint64         // bumped to empty every shard's lookup cache
	spread     atomic.Uint64         // runs of loads dealt so far: where dealLoad starts looking, so that ties go round
	leads      atomic.Uint32         // large lookups led so far (request.lead): their leads go round the shards
	draining   atomic.Int32          // Close, and owners still waiting for the kernel after it: the last frees the buffers
	poolStores atomic.Int32          // stores on the io_uring engine's store pools, all rings' (ringWriteMin)
	broken     atomic.Pointer[error] // set once when an engine fails (ErrBroken): submits return it

	evictor   *evictor      // with a capacity; nil otherwise
	touchC    chan touch    // blocks whose use owners report (TouchInterval)
	touchStop chan struct{} // ends the toucher
	touchDone chan struct{} // closed when the toucher has gone
}

type doneEntry struct {
	slot    int32
	release bool // an OpRelease event rather than the request's Result
}

// EngineInfo says which engine a tier runs and why.
type EngineInfo struct {
	Kind     EngineKind // EngineURing or EngineSync
	Fallback string     // why EngineAuto chose sync; empty otherwise
	Rings    int        // io_uring instances
	Flags    string     // io_uring setup flags in force
	Direct   bool       // loads and stores of aligned buffers use O_DIRECT
	NoDirect string     // why not, when Direct is false
	FS       string     // the filesystem under the namespace directory
	// Broken says why the engine failed, once it has (ErrBroken); empty
	// while it works.
	Broken string
	// Inline says whether the io_uring engine lets the kernel answer
	// reads and writes in the owner's thread when it can do so without
	// blocking; false on filesystems that may block anyway (FUSE, NFS,
	// unknown), where they all go to kernel workers.
	Inline bool
	// OwnThreads says whether each io_uring owner keeps an OS thread of
	// its own (SINGLE_ISSUER; DEFER_TASKRUN too where Inline), so that its
	// ring has one set of kernel workers, bounded by WorkersMax: where
	// everything may go to workers (Inline false) or every lookup does
	// (LookupStatx, LookupMixed). Otherwise owners are ordinary
	// goroutines, cheaper to wake.
	OwnThreads bool
	// StoresSync says whether the io_uring engine runs stores, O_DIRECT
	// ones too, as plain system calls on a pool of goroutines (SyncWorkers
	// in all), as the sync engine does: on a local filesystem (Inline),
	// unless Options.StoresOnRing. An O_DIRECT store's write (Direct) is
	// the exception while more than 4 stores are on the pools, but on
	// tmpfs (LoadsSync): the pool allocates the file's blocks and the
	// write goes on the ring, its goroutine parked meanwhile, so that no
	// thread waits for the device. With fewer in flight a pool's thread
	// waits for its write, as the sync engine's do: cheaper than the
	// hand-offs.
	StoresSync bool
	// LoadsSync says whether the io_uring engine runs loads on that pool
	// too: on tmpfs, whose files do not take IOCB_NOWAIT, so that every
	// read the ring made would go to a kernel worker.
	LoadsSync bool
	// LastPageApart says whether the io_uring engine's O_DIRECT loads read
	// each block's last page apart first (blockstore.Config.AsyncDirectReads):
	// on a filesystem where Inline is false and a probe at Open found an
	// asynchronous O_DIRECT read that ends past the end of a file counted
	// in full (go-fuse's server; not GlusterFS's client). A read
	// of a page more a load.
	LastPageApart bool
}

// testLoadsSync, when set (by tests), makes every io_uring tier run its
// loads on the pool (EngineInfo.LoadsSync).
var testLoadsSync bool

// request is one submitted batch. Fields are written by the submitting
// caller before the request is handed to the owners, then by the owners
// (res, per key, each key by exactly one owner), then read by Poll after
// remaining reaches zero.
type request struct {
	id         uint64
	op         Op
	prefixOnly bool
	keyData    []byte          // the keys, copied and concatenated
	keyEnd     []int32         // key i is keyData[keyEnd[i-1]:keyEnd[i]]
	hashes     []uint64        // key hashes, by the caller (empty where the owners hash: ownersHash)
	ownHashes  []uint64        // where the owners hash: key hashes, each hashChunk of them by the owner that claimed them (shard.hashChunks)
	chunks     []atomic.Uint32 // where the owners hash: each chunk of ownHashes chunkFree, chunkClaimed or chunkHashed
	runs       []uint8         // loads: key i goes to shard runs[i/loadRun] (Tier.dealLoad)
	bufs       [][]byte        // caller buffers for loads and stores
	res        []KeyResult
	cursor     []int32 // per shard: next key index that shard has not looked at
	lead       int     // a large lookup with the cache on: the shard given it first (shard.dispatchLeads), else -1
	deadline   time.Time
	submitted  time.Time    // when the submit call began: request latency and queue wait start here
	remaining  atomic.Int32 // keys without an outcome + shards holding the request
	firstMiss  atomic.Int32 // prefix-only: lowest index found missing, else len(keys)
	canceled   atomic.Bool
	gen        atomic.Uint64 // bumped each time the slot is taken, so a late Cancel can tell
	published  bool          // guarded by Tier.mu
	held       int           // buffers still with the kernel; guarded by Tier.mu
	heldPolled bool          // Poll returned the Result with Held > 0, so an OpRelease is owed; guarded by Tier.mu
	slot       int32
	own        chan<- *request // the tier's own request (the evictor's): its Result goes here, not to Poll
}

// resize returns s with length n and every element zero, reusing its
// capacity when it suffices.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

func (r *request) n() int { return len(r.keyEnd) }

// hash is key i's hash: the caller's, or where the owners hash, the one an
// owner stored (hashChunks), or else worked out again. Inlined, the
// caller's.
func (r *request) hash(seed maphash.Seed, i int) uint64 {
	if i < len(r.hashes) {
		return r.hashes[i]
	}
	return r.ownHash(seed, i)
}

func (r *request) ownHash(seed maphash.Seed, i int) uint64 {
	if c := i / hashChunk; c < len(r.chunks) && r.chunks[c].Load() == chunkHashed {
		return r.ownHashes[i]
	}
	return maphash.Bytes(seed, r.key(i))
}

// Where the owners hash a request's keys and more than one owner takes it,
// each hashChunk keys of it are hashed once, by the first owner that
// claims them, and the others read those hashes: each owner hashing every
// key cost cached lookups on two rings 1.2x the CPU a key (tierbench
// lookup, 512 blocks, every key present, --cache-ttl 1s, 6 runs each
// way); their keys a second moved within this VM's drift
// (BenchmarkLookupCached, docs/performance.md, sixth sitting).
const (
	hashChunk = 64

	chunkFree    = 0
	chunkClaimed = 1
	chunkHashed  = 2
)

// ownersHash says whether the owners hash a request's keys instead of the
// caller: a batch of ownersHashKeys keys or more has keys for every shard
// anyway, and the hashes were a third of a 1,024-key Lookup call
// (BenchmarkCallerFloor, 6 interleaved rounds: the Lookup call's p50 5.8-6.6
// us against 9.9-17.2, the p99.9 of all calls 31-46 us against 41-71;
// BenchmarkLookup's keys a second and CPU a key the same). Each owner then
// hashes every key to find its own, 3-4 ns a key, so not with more than
// ownersHashShards shards: at 8, 2% of a warm lookup's CPU.
func ownersHash(keys, shards int) bool {
	return keys >= ownersHashKeys && shards <= ownersHashShards
}

const (
	ownersHashKeys   = 128
	ownersHashShards = 8
)

// shardOfHash maps a key's hash onto one of n shards by its top 32 bits
// (a multiply and a shift, where a modulo divides).
func shardOfHash(h uint64, n int) int { return int((h >> 32) * uint64(n) >> 32) }

// loadRun is how many keys of a load go to one shard together: a Load call
// of up to loadRun keys wakes one owner, not every one (the caller's call is
// cheaper, and it is preempted less by the threads it wakes), and larger
// batches still spread over every ring. 64 KiB loads, batches of 16, a ring
// per CPU, against the keys of each batch dealt round the rings one by one
// (5 interleaved rounds): O_DIRECT 20,400 -> 25,100 keys/s and caller
// p99.9 463 -> 299 µs at the median.
const loadRun = 16

// dealLoad gives each run of loadRun keys of r to the shard with the fewest
// load keys unanswered (ties taken in turn), and counts them there until
// setKey answers them. Dealt in strict turn instead, whole batches piled up
// on one ring whenever the other's had finished first: 256 KiB page-cache
// loads made 0.64-0.85 of the sync engine's keys/s with 15% of the CPUs
// idle, and make 0.94-1.15 so. Through the page cache, a run whose first
// buffer is one of the tier's goes back to the shard its last load went
// to, unless that shard has a run's keys more than the fewest: the owner
// that copied into a buffer last is likely still on the CPU whose cache
// holds the buffer's lines, written by that copy, and a copy into lines
// another CPU holds costs more (2 MiB page-cache reads into a buffer last
// read on the other CPU: 1.27x the time). Not with O_DIRECT, where the
// device writes the buffer: 256 KiB O_DIRECT loads (BenchmarkLoad, 4
// interleaved rounds) made 0.83-0.99x the bytes a second so. It returns
// the mask of the shards given keys.
func (t *Tier) dealLoad(r *request) (mask uint64) {
	n := len(t.shards)
	r.runs = r.runs[:0]
	for start := 0; start < r.n(); start += loadRun {
		m := int64(min(loadRun, r.n()-start))
		first := int(t.spread.Add(1) % uint64(n))
		best := first
		for k := 1; k < n; k++ {
			if j := (first + k) % n; t.shards[j].loadKeys.Load() < t.shards[best].loadKeys.Load() {
				best = j
			}
		}
		if home := t.homeOf(r.bufs[start]); home != nil {
			if h := int(home.Load()) - 1; h >= 0 && t.shards[h].loadKeys.Load() <= t.shards[best].loadKeys.Load()+m {
				best = h
			}
			home.Store(uint32(best) + 1)
		}
		t.shards[best].loadKeys.Add(m)
		r.runs = append(r.runs, uint8(best))
		mask |= 1 << best
	}
	return mask
}

func (r *request) key(i int) []byte {
	start := int32(0)
	if i > 0 {
		start = r.keyEnd[i-1]
	}
	return r.keyData[start:r.keyEnd[i]]
}

// Open opens a tier on the directory dir (created if needed), storing blocks
// under dir/<Namespace>.
func Open(dir string, opts Options) (*Tier, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	bsOpts := blockstore.Options{Durability: opts.Durability, Layout: opts.Layout, Format: opts.Format}
	if opts.Format == blockstore.FormatRaw {
		bsOpts.BlockSize = int64(opts.BlockSize)
	}
	store, err := blockstore.Open(dir, bsOpts)
	if err != nil {
		return nil, err
	}
	if opts.VLLM != nil {
		if err := opts.VLLM.WriteConfig(store.Root()); err != nil {
			return nil, fmt.Errorf("tier: vLLM run config: %w", err)
		}
	}
	nsDir, err := store.NamespaceDir(opts.Namespace)
	if err != nil {
		return nil, err
	}
	t := &Tier{
		opts:    opts,
		store:   store,
		nsDir:   nsDir,
		qDir:    store.QuarantineDir(),
		seed:    maphash.MakeSeed(),
		ready:   make(chan struct{}, 1),
		reqs:    make([]request, opts.Depth+1), // the last is the evictor's: callers filling Depth do not starve it
		byID:    make(map[uint64]int32, opts.Depth),
		done:    make([]doneEntry, 0, 2*opts.Depth),
		closeCh: make(chan struct{}),
		log:     opts.Logger,
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	t.log = t.log.With("dir", nsDir)
	for i := range opts.Depth {
		t.free = append(t.free, int32(opts.Depth-1-i))
	}
	if t.quarantines() {
		if err := blockstore.MkdirAll(t.qDir); err != nil {
			return nil, fmt.Errorf("tier: %w", err)
		}
	}
	if err := t.startEngine(); err != nil {
		return nil, err
	}
	if t.opts.TouchInterval > 0 {
		t.touchC, t.touchStop, t.touchDone = make(chan touch, touchQueue), make(chan struct{}), make(chan struct{})
		go t.toucher(t.touchStop, t.touchDone)
	}
	if t.capacityOn() {
		t.cap.limit.Store(t.opts.Capacity)
		t.evictor = newEvictor(t)
		t.evictor.estimate()
		go t.evictor.run()
	}
	return t, nil
}

func (t *Tier) startEngine() error {
	// Before anything is allocated, so that refusing EngineURing leaves
	// nothing to release.
	cfg := t.programConfig(nil)
	if err := cfg.Check(); err != nil {
		return fmt.Errorf("tier: %w: %w", ErrInvalidOptions, err)
	}
	info, local, err := chooseEngine(t.nsDir, t.opts)
	if err != nil {
		return err
	}
	t.engine, t.local = info, local
	if info.Fallback != "" {
		t.log.Warn("tier: io_uring is unusable here: falling back to the sync engine", "reason", info.Fallback)
	}
	n := 1
	if info.Kind == EngineURing {
		n = info.Rings
	}
	if t.ns, err = openNSDirFD(t, n); err != nil {
		return err
	}
	if err := t.allocBuffers(); err != nil {
		t.ns.close()
		return err
	}
	for i := range n {
		t.shards = append(t.shards, newShard(t, i))
	}
	started := make(chan startedShard, n)
	for _, s := range t.shards {
		go s.run(started)
	}
	var first error
	for range t.shards {
		r := <-started
		if r.err != nil && first == nil {
			first = r.err
		}
		if r.err == nil {
			info = r.info // the same from every owner; taken in after all have read t.engine
		}
	}
	if first != nil {
		// Close stops the shards that did start and frees the buffers.
		t.Close(context.Background())
		return first
	}
	t.engine = info
	t.logEngine()
	return nil
}

// chooseEngine says which engine a tier on dir with opts gets, and what the
// filesystem there allows: io_uring where it is usable (or an error if
// opts ask for it and it is not), else the sync engine and why; and
// whether the filesystem is local (inlineSafe), for either engine.
func chooseEngine(dir string, opts Options) (EngineInfo, bool, error) {
	var e EngineInfo
	e.Kind = opts.Engine
	if e.Kind != EngineSync {
		if err := uring.Available(); err == nil {
			e.Kind = EngineURing
		} else if e.Kind == EngineURing {
			return e, false, fmt.Errorf("tier: engine uring: %w", err)
		} else {
			e.Kind, e.Fallback = EngineSync, err.Error()
		}
	}
	local, fs := inlineSafe(dir)
	e.FS = fs
	var miscounted bool
	e.Direct, e.NoDirect, miscounted = probeDirect(dir, opts, e.Kind == EngineURing && !local)
	if e.Kind == EngineURing {
		e.Inline = local
		e.Rings = opts.Rings
		e.OwnThreads = !e.Inline || opts.Lookup != LookupOpenPath
		e.StoresSync = e.Inline && !opts.StoresOnRing
		e.LoadsSync = e.FS == "tmpfs" || testLoadsSync
		e.LastPageApart = miscounted
	}
	return e, local, nil
}

// startedShard is what a shard's owner says once its backend is set up:
// the engine as that backend found it, or why it could not start.
type startedShard struct {
	info EngineInfo
	err  error
}

// run is a shard's owner goroutine, with either engine: it sets up the
// shard's backend (an io_uring owner with EngineInfo.OwnThreads first takes
// a thread of its own), says how that went on started, and runs the
// shard's loop.
func (s *shard) run(started chan<- startedShard) {
	if s.t.engine.OwnThreads {
		runtime.LockOSThread() // for the ring's life; the thread exits with the goroutine
	}
	be, info, err := newBackend(s.t, s)
	if err != nil {
		close(s.exited)
		started <- startedShard{err: err}
		return
	}
	s.be = be
	started <- startedShard{info: info}
	s.loop()
}

// newBackend sets up shard s's backend of the engine chooseEngine chose
// (t.engine), on the shard's owner goroutine, and returns it with the
// engine as it is in force there: EngineInfo.Flags are the io_uring setup
// flags the kernel granted.
func newBackend(t *Tier, s *shard) (backend, EngineInfo, error) {
	info := t.engine
	if testBackend != nil {
		return testBackend(t, s), info, nil
	}
	if info.Kind != EngineURing {
		b, err := newSyncBackend(t, s)
		return b, info, err
	}
	b, err := newURingBackend(t, s)
	if err != nil {
		return nil, info, err
	}
	info.Flags = b.ring.Flags().String()
	return b, info, nil
}

// testBackend, when set (by benchmarks), makes every shard's backend in
// place of the engine's.
var testBackend func(t *Tier, s *shard) backend

// logEngine logs the engine in force and why, and whether loads use
// O_DIRECT and why not.
func (t *Tier) logEngine() {
	e := t.engine
	why := "asked for (Options.Engine or " + EngineEnv + ")"
	switch {
	case e.Fallback != "":
		why = "io_uring is unusable: " + e.Fallback
	case t.opts.Engine == EngineAuto:
		why = "auto: io_uring is usable here"
	}
	attrs := []any{"engine", e.Kind.String(), "why", why, "fs", e.FS}
	if e.Kind == EngineURing {
		attrs = append(attrs, "rings", e.Rings, "flags", e.Flags, "inline", e.Inline, "own_threads", e.OwnThreads, "stores_sync", e.StoresSync, "loads_sync", e.LoadsSync)
	} else {
		attrs = append(attrs, "workers", t.opts.SyncWorkers)
	}
	t.log.Info("tier: engine", attrs...)
	if e.Direct {
		t.log.Info("tier: loads and stores use O_DIRECT")
	} else {
		t.log.Info("tier: loads and stores go through the page cache", "why", e.NoDirect)
	}
}

// Engine says which engine is in use and, for a fallback, why.
func (t *Tier) Engine() EngineInfo {
	e := t.engine
	if err := t.broken.Load(); err != nil {
		e.Broken = (*err).Error()
	}
	return e
}

// BlockStore returns the synchronous block store under the tier, for
// maintenance (scan, verify, clean, usage, evict).
func (t *Tier) BlockStore() *blockstore.Store { return t.store }

// Namespace returns the tier's namespace.
func (t *Tier) Namespace() string { return t.opts.Namespace }

// BlockSize returns the payload size of every block.
func (t *Tier) BlockSize() int { return t.opts.BlockSize }

// Ready returns a channel that receives when results are waiting for Poll.
// A receive is a hint: Poll until it returns 0.
func (t *Tier) Ready() <-chan struct{} { return t.ready }

// Lookup submits a batch asking which of keys exist. It returns at once:
// nil (queued), ErrBusy, ErrClosed or an ErrInvalid error. keys are copied.
func (t *Tier) Lookup(req uint64, keys [][]byte) error {
	return t.submit(req, OpLookup, false, keys, nil)
}

// LookupPrefix is Lookup for a caller that only wants the prefix: keys
// after a definite miss may be skipped (StatusSkipped).
func (t *Tier) LookupPrefix(req uint64, keys [][]byte) error {
	return t.submit(req, OpLookup, true, keys, nil)
}

// Load submits a batch reading blocks into bufs (each exactly BlockSize
// bytes). The buffers belong to the tier until the request's Result (and,
// if Result.Held > 0, its OpRelease) has been polled.
func (t *Tier) Load(req uint64, keys [][]byte, bufs [][]byte) error {
	return t.submit(req, OpLoad, false, keys, bufs)
}

// Store submits a batch writing blocks from bufs (each exactly BlockSize
// bytes), under the same buffer rule as Load.
func (t *Tier) Store(req uint64, keys [][]byte, bufs [][]byte) error {
	return t.submit(req, OpStore, false, keys, bufs)
}

// Delete submits a batch removing blocks: each key ends StatusDeleted, or
// StatusMissing if there was no block. Deletes go to the filesystem after
// the lookups, loads and stores queued with them. A load that opened a
// block before its delete reads it whole; one that comes after reports it
// missing.
func (t *Tier) Delete(req uint64, keys [][]byte) error {
	return t.submit(req, OpDelete, false, keys, nil)
}

func (t *Tier) submit(id uint64, op Op, prefixOnly bool, keys [][]byte, bufs [][]byte) error {
	_, err := t.submitTo(id, op, prefixOnly, keys, bufs, nil)
	return err
}

// submitOwn submits a request of the tier's own: its Result is sent to
// own (which must have room), never polled, and the receiver hands the
// request back with releaseOwn.
func (t *Tier) submitOwn(op Op, keys [][]byte, own chan<- *request) (*request, error) {
	return t.submitTo(0, op, false, keys, nil, own)
}

// ownSlot is the request slot kept for the tier's own requests.
func ownSlot(t *Tier) int32 { return int32(len(t.reqs) - 1) }

// releaseOwn lets go of a finished request of the tier's own.
func (t *Tier) releaseOwn(r *request) {
	t.mu.Lock()
	clear(r.bufs)
	t.mu.Unlock()
}

func (t *Tier) submitTo(id uint64, op Op, prefixOnly bool, keys [][]byte, bufs [][]byte, own chan<- *request) (*request, error) {
	// Closed first: after Close every call returns ErrClosed, also one
	// that is invalid besides.
	if t.closed.Load() {
		return nil, ErrClosed
	}
	if err := t.broken.Load(); err != nil {
		return nil, *err
	}
	start := time.Now()
	if err := t.validate(op, keys, bufs); err != nil {
		return nil, err
	}
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	if _, dup := t.byID[id]; dup && own == nil {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: request %d is already in flight", ErrInvalid, id)
	}
	var slot int32
	switch {
	case own != nil:
		slot = ownSlot(t) // one request of its own at a time
	case len(t.free) == 0:
		t.mu.Unlock()
		t.stats.busy.Add(1)
		return nil, ErrBusy
	default:
		slot = t.free[len(t.free)-1]
		t.free = t.free[:len(t.free)-1]
	}
	r := &t.reqs[slot]
	r.own = own
	if own == nil {
		t.byID[id] = slot
	}
	r.slot = slot
	r.gen.Add(1)
	r.published = false
	r.held = 0
	r.heldPolled = false
	r.canceled.Store(false) // under mu: a Cancel that finds r in byID is never undone
	t.calls.Add(1)          // Close waits for this request to reach the shards
	t.mu.Unlock()
	defer t.calls.Done()

	r.id, r.op, r.prefixOnly = id, op, prefixOnly
	// Grown once to size, not by appends: a slot's first request touches
	// fresh memory, and each page's first touch is a fault (on a VM, tens
	// of µs) in the caller's call.
	size := 0
	for _, k := range keys {
		size += len(k)
	}
	// The copy is most of the call's work (1,024 keys): local slices and
	// seed, so the loop keeps them in registers, and the shards' mask
	// taken on the way. A large batch goes to every shard, whose owners
	// hash its keys (ownersHash).
	data := slices.Grow(r.keyData[:0], size)
	ends, hashes := slices.Grow(r.keyEnd[:0], len(keys)), r.hashes[:0]
	seed, n := t.seed, len(t.shards)
	var mask uint64
	r.chunks = r.chunks[:0]
	if ownersHash(len(keys), n) {
		for _, k := range keys {
			data = append(data, k...)
			ends = append(ends, int32(len(data)))
		}
		mask = 1<<n - 1
		if n > 1 && op != OpLoad {
			// Not written here: no owner reads a hash before its chunk
			// is hashed.
			if cap(r.ownHashes) < len(keys) {
				r.ownHashes = make([]uint64, len(keys))
			}
			r.ownHashes = r.ownHashes[:len(keys)]
			r.chunks = resize(r.chunks, (len(keys)+hashChunk-1)/hashChunk)
		}
	} else {
		hashes = slices.Grow(hashes, len(keys))
		for _, k := range keys {
			data = append(data, k...)
			ends = append(ends, int32(len(data)))
			h := maphash.Bytes(seed, k)
			hashes = append(hashes, h)
			mask |= 1 << shardOfHash(h, n)
		}
	}
	r.keyData, r.keyEnd, r.hashes = data, ends, hashes
	r.bufs = append(r.bufs[:0], bufs...)
	r.res = resize(r.res, len(keys))
	r.cursor = resize(r.cursor, len(t.shards))
	timeout := t.opts.IOTimeout
	if op == OpLookup {
		timeout = t.opts.LookupTimeout
	}
	r.submitted = start
	r.deadline = start.Add(timeout)
	r.firstMiss.Store(int32(len(keys)))
	t.stats.requests[op].Add(1)
	t.stats.keys[op].Add(uint64(len(keys)))
	if len(keys) == 0 || op == OpLookup && t.answered(r, mask, start) {
		if len(keys) > 0 && answeredInCall != nil {
			answeredInCall(r)
		}
		t.publish(r)
		return r, nil
	}
	// Each shard with keys of r holds a reference, counted in remaining
	// like a key, until it has let go of r: so r is published, and its
	// slot reused, only once no shard can still be looking at it.
	r.lead = -1
	switch {
	case op == OpLoad:
		mask = t.dealLoad(r)
	case op == OpLookup && len(r.chunks) > 0 && t.opts.LookupCacheTTL > 0:
		r.lead = int(t.leads.Add(1) % uint32(n))
		mask = 1 << r.lead
	}
	r.remaining.Store(int32(len(keys) + bits.OnesCount64(mask)))
	for i, s := range t.shards {
		if mask&(1<<i) != 0 {
			s.enqueue(r)
		}
	}
	return r, nil
}

// answered answers lookup r in the caller's call from the lookup caches
// (fromCaches) if the caller hashed its keys (a batch under
// ownersHashKeys); otherwise, or if the caches do not hold every key, it
// reports false and the owners answer r. A scheduler asks about the same
// prefix at every step: such a call wakes no owner, and its Result is
// ready for the next Poll.
func (t *Tier) answered(r *request, mask uint64, now time.Time) bool {
	return t.opts.LookupCacheTTL > 0 && r.n() < ownersHashKeys && len(r.hashes) == r.n() && t.fromCaches(r, mask, now, false)
}

// fromCaches answers every key of lookup r, on the shards in mask, from
// their lookup caches if they hold every one, fresh, in each cache's
// current epoch, with no news from a load on its way to that cache
// (shard.learnedN); in a prefix lookup the keys after one the cache says
// is missing are skipped, held or not. Otherwise it leaves r's results as
// they were and reports false. It reads each cache under its cacheMu,
// taking them all in the shards' order (an owner takes only its own); if
// one is held and wait is false (the caller's call, which must not wait
// for an owner), it reports false at once. It counts the outcomes as the
// owners would.
func (t *Tier) fromCaches(r *request, mask uint64, now time.Time, wait bool) bool {
	n, epoch := len(t.shards), t.cacheEpoch.Load()
	ok, locked := true, uint64(0)
	var ages [ringsBound]time.Duration
	for si, s := range t.shards {
		if mask&(1<<si) == 0 {
			continue
		}
		if wait {
			s.cacheMu.Lock()
		} else if !s.cacheMu.TryLock() {
			ok = false
			break
		}
		locked |= 1 << si
		ok = ok && s.cacheEpoch == epoch && s.learnedN.Load() == 0
		ages[si] = now.Sub(s.epoch)
	}
	// Found, missing and skipped keys by shard, counted as they are answered.
	var c [ringsBound][3]uint32
	missed := false // a prefix lookup's key after a miss: skipped
	for i := 0; ok && i < r.n(); i++ {
		h := r.hash(t.seed, i)
		si := shardOfHash(h, n)
		if missed {
			r.res[i].Status = StatusSkipped
			c[si][2]++
			continue
		}
		found, cached := t.shards[si].cached(h, r.key(i), ages[si])
		switch {
		case !cached:
			ok = false
		case found:
			r.res[i].Status = StatusFound
			c[si][0]++
		default:
			r.res[i].Status = StatusMissing
			c[si][1]++
			missed = r.prefixOnly
		}
	}
	for si, s := range t.shards {
		if locked&(1<<si) != 0 {
			s.cacheMu.Unlock()
		}
	}
	if !ok {
		clear(r.res)
		return false
	}
	for si, s := range t.shards {
		if mask&(1<<si) != 0 {
			var k [statusKinds]uint64
			k[StatusFound], k[StatusMissing], k[StatusSkipped] = uint64(c[si][0]), uint64(c[si][1]), uint64(c[si][2])
			s.countCached(OpLookup, k)
		}
	}
	return true
}

// answeredInCall, when set (by tests), is called with each lookup that
// answered in the caller's call (answered), before it is published.
var answeredInCall func(r *request)

func (t *Tier) validate(op Op, keys [][]byte, bufs [][]byte) error {
	if len(keys) > t.opts.BatchMax {
		return fmt.Errorf("%w: %d keys (BatchMax is %d)", ErrInvalid, len(keys), t.opts.BatchMax)
	}
	for i, k := range keys {
		if err := blockstore.ValidateKey(k); err != nil {
			return fmt.Errorf("%w: key %d: %w", ErrInvalid, i, err)
		}
	}
	if op == OpLookup || op == OpDelete {
		if bufs != nil {
			return fmt.Errorf("%w: a %v takes no buffers", ErrInvalid, op)
		}
		return nil
	}
	if len(bufs) != len(keys) {
		return fmt.Errorf("%w: %d keys but %d buffers", ErrInvalid, len(keys), len(bufs))
	}
	for i, b := range bufs {
		if len(b) != t.opts.BlockSize {
			return fmt.Errorf("%w: buffer %d is %d bytes, BlockSize is %d", ErrInvalid, i, len(b), t.opts.BlockSize)
		}
	}
	return nil
}

// setKey records key i's outcome, counted in s; the owner that records
// the last one publishes the request.
func (s *shard) setKey(r *request, i int, st Status, err error) {
	s.answer(r, i, st, err)
	s.countOutcome(r.op, st, err)
	s.t.settle(r)
}

// endKey is setKey for a key that an op of finishDone's answered: its
// outcome is counted, and r settled, at the end of finishDone (endedKeys).
func (s *shard) endKey(r *request, i int, st Status, err error) {
	s.answer(r, i, st, err)
	s.countMoved(r.op, st, err)
	s.ended.add(r, st)
}

// answer writes key i's outcome into r's results.
func (s *shard) answer(r *request, i int, st Status, err error) {
	t := s.t
	if r.op == OpLoad {
		t.shards[r.runs[i/loadRun]].loadKeys.Add(-1)
	}
	r.res[i] = KeyResult{Status: st, Err: err}
	t.noteMiss(r, i, st)
}

// noteMiss records, for a prefix lookup, the first key not found.
func (t *Tier) noteMiss(r *request, i int, st Status) {
	if r.prefixOnly && !st.OK() {
		for {
			cur := r.firstMiss.Load()
			if int32(i) >= cur || r.firstMiss.CompareAndSwap(cur, int32(i)) {
				break
			}
		}
	}
}

// settle counts down one key outcome or shard reference of r, and
// publishes r at zero.
func (t *Tier) settle(r *request) { t.settleN(r, 1) }

// settleN counts down n key outcomes of r at once.
func (t *Tier) settleN(r *request, n int32) {
	if r.remaining.Add(-n) == 0 {
		t.publish(r)
	}
}

// broke records that an engine failed; later submits return err.
func (t *Tier) broke(err error) { t.broken.CompareAndSwap(nil, &err) }

// drained lets go of one reference in draining; the last frees the
// buffers, which no kernel operation can use any more.
func (t *Tier) drained() {
	if t.draining.Add(-1) == 0 {
		t.freeBuffers()
	}
}

func (t *Tier) publish(r *request) {
	t.stats.request[r.op].Record(time.Since(r.submitted))
	// No owner reads r's keys any more. Zeroing them here, on the owner's
	// CPU, leaves their cache lines modified in its cache alone, and the
	// next submit into this slot takes each in one transfer: writing lines
	// that the owners' caches still shared cost the caller 8-30 ns a line.
	// A 1,024-key Lookup call, BenchmarkCallerFloor, 8 interleaved rounds:
	// 9.1-10.9 us at the median against 18.7-25.3 without this.
	clear(r.keyData)
	clear(r.keyEnd)
	clear(r.hashes)
	t.mu.Lock()
	r.published = true
	if r.own != nil {
		t.mu.Unlock()
		r.own <- r
		return
	}
	t.done = append(t.done, doneEntry{slot: r.slot})
	t.mu.Unlock()
	t.signal()
}

func (t *Tier) signal() {
	select {
	case t.ready <- struct{}{}:
	default:
	}
}

// hold records that the kernel keeps one of r's buffers past r's deadline.
func (t *Tier) hold(r *request) {
	t.mu.Lock()
	r.held++
	t.mu.Unlock()
	t.stats.held.Add(1)
}

// unhold records that the kernel let go of one of r's buffers.
func (t *Tier) unhold(r *request) {
	t.stats.held.Add(-1)
	t.mu.Lock()
	r.held--
	// Only a caller told Held > 0 waits for OpRelease; a Result polled with
	// Held == 0 has already freed the slot.
	if r.held == 0 && r.heldPolled {
		t.done = append(t.done, doneEntry{slot: r.slot, release: true})
		t.mu.Unlock()
		t.signal()
		return
	}
	t.mu.Unlock()
}

// Poll copies finished requests into dst and returns how many. It never
// blocks. Keys of each Result reuse the capacity dst[i].Keys already has.
func (t *Tier) Poll(dst []Result) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for n < len(dst) && n < len(t.done) {
		e := t.done[n]
		r := &t.reqs[e.slot]
		d := &dst[n]
		d.Req = r.id
		if e.release {
			d.Op, d.Keys, d.Prefix, d.Held = OpRelease, d.Keys[:0], 0, 0
			t.freeSlot(e.slot)
			n++
			continue
		}
		d.Op = r.op
		d.Keys = append(d.Keys[:0], r.res...)
		d.Prefix = 0
		for d.Prefix < len(r.res) && r.res[d.Prefix].Status.OK() {
			d.Prefix++
		}
		d.Held = r.held
		if r.held == 0 {
			t.freeSlot(e.slot)
		} else {
			r.heldPolled = true
		}
		n++
	}
	copy(t.done, t.done[n:])
	t.done = t.done[:len(t.done)-n]
	if len(t.done) > 0 {
		t.signal()
	}
	return n
}

// freeSlot returns a request slot; the caller holds t.mu.
func (t *Tier) freeSlot(slot int32) {
	r := &t.reqs[slot]
	delete(t.byID, r.id)
	clear(r.bufs) // drop references to caller memory
	t.free = append(t.free, slot)
}

// Cancel cancels request req: keys not yet started end StatusCanceled,
// keys in the kernel are canceled where the kernel allows, and the
// request's Result still arrives. It reports whether req was in flight.
func (t *Tier) Cancel(req uint64) bool {
	t.mu.Lock()
	slot, ok := t.byID[req]
	if !ok || t.reqs[slot].published || t.closed.Load() {
		t.mu.Unlock()
		return false
	}
	r := &t.reqs[slot]
	r.canceled.Store(true) // under mu, so it cannot land on a reused slot
	gen := r.gen.Load()
	t.calls.Add(1)
	t.mu.Unlock()
	defer t.calls.Done()
	for _, s := range t.shards {
		s.cancel(r, gen)
	}
	return true
}

// Close stops the tier. Requests submitted before Close each get exactly
// one Result (their outcome, or StatusCanceled), which Poll still returns
// after Close; every later call returns ErrClosed. Close returns when the
// engine's rings and goroutines are gone, or at ctx's deadline with an
// error wrapping ErrStuck that counts the operations a hung filesystem
// still holds (their keys end StatusCanceled). The buffers of such loads
// and stores stay with the kernel until it lets go of them: their Results
// count them in Held, and an OpRelease follows for each once it does (Poll
// works after Close). The engine's owners wait for those operations in the
// background and release rings, descriptors and buffers after the last. A
// second Close returns the first one's result, or, if its own ctx ends
// while the first still waits, an error wrapping ErrStuck.
func (t *Tier) Close(ctx context.Context) error {
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		select {
		case <-t.closeCh:
			return t.closeErr
		case <-ctx.Done():
			return fmt.Errorf("tier: close: %w: another Close still waits for the filesystem", ErrStuck)
		}
	}
	t.closed.Store(true)
	t.mu.Unlock()
	if e := t.evictor; e != nil {
		// Before the shards stop: it may be waiting for their deletes. A
		// scan in a hung filesystem is left behind (it lets go of the
		// lease when the filesystem answers).
		close(e.stop)
		select {
		case <-e.done:
		case <-ctx.Done():
		}
	}
	t.calls.Wait() // no submit or cancel is half-way to a shard
	t.draining.Add(1)

	for _, s := range t.shards {
		s.stop()
	}
	stuck := 0
	for _, s := range t.shards {
		select {
		case <-s.exited:
		case <-ctx.Done():
		}
	}
	for _, s := range t.shards {
		s.giveUp()
	}
	for _, s := range t.shards {
		<-s.exited
		stuck += s.stuckAtExit
	}
	if stuck > 0 {
		t.closeErr = fmt.Errorf("tier: close: %w: %d operations still held by the filesystem", ErrStuck, stuck)
		t.log.Warn("tier: closed with operations stuck in the filesystem; their buffers and the rings are released when it answers", "stuck", stuck)
	}
	if t.touchStop != nil {
		close(t.touchStop) // touches queued now are dropped
		select {
		case <-t.touchDone:
		case <-ctx.Done():
		}
	}
	t.drained()
	close(t.closeCh)
	return t.closeErr
}
