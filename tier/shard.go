package tier

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/uringtier/uringtier/blockstore"
	"golang.org/x/sys/unix"
)

// backend issues the IO of key operations for one shard. All its methods
// but wake are called by the shard's owner goroutine only.
type backend interface {
	// start begins op i. The op, its key and its buffer belong to the
	// backend until it reports i done. It appends to done the ops that
	// finished meanwhile, their outcome set: an io_uring owner hands its
	// SQEs over in chunks as it starts them, and reaps what completed
	// inline.
	start(i int32, o *op, done []int32) []int32
	// wait blocks for at most d until an op finishes or wake is called,
	// and appends the finished ops to done, their outcome set.
	wait(d time.Duration, done []int32) []int32
	// cancel asks the kernel to end op i early, where it can.
	cancel(i int32, o *op)
	// wake ends a wait; safe from any goroutine.
	wake()
	// wakeCalls reports whether a wake now would make a system call (an
	// eventfd write, the owner asleep on it), not only a channel send;
	// safe from any goroutine.
	wakeCalls() bool
	// sleepsOnKernel reports whether the owner's next wait may sleep where
	// only a completion or a wake's system call ends it (an eventfd,
	// io_uring_enter), not on a channel that every wake reaches; owner only.
	sleepsOnKernel() bool
	// close releases the backend, once no op is in flight.
	close()
}

// op is one key operation in flight. Owner-only, except the outcome,
// which the backend writes before reporting the op done.
type op struct {
	kind      Op
	key       [blockstore.KeySizeMax]byte
	keyLen    uint8
	hash      uint64
	buf       []byte    // the caller's buffer, for loads and stores
	holder    *request  // the request whose buffer a load or store uses
	waiters   []waiter  // requests waiting for this op's outcome
	deadline  time.Time // earliest waiter deadline
	started   time.Time
	epoch     uint64 // the shard's cacheEpoch when the op started
	inUse     bool
	abandoned bool // every waiter timed out: stuck until the kernel answers
	canceled  bool // cancel was asked of the backend
	probe     bool // the circuit breaker's probe
	ringWrite bool // an O_DIRECT store on the store pool makes its write on the ring (uringBackend.start)

	status Status // outcome, set by the backend
	err    error
}

func (o *op) keyBytes() []byte { return o.key[:o.keyLen] }

type waiter struct {
	r *request
	i int32
}

// cacheEntry is one answered lookup; the key is stored to tell hash
// collisions apart.
type cacheEntry struct {
	key    [blockstore.KeySizeMax]byte
	keyLen uint8
	found  bool
	at     int64 // nanoseconds since the shard's epoch
}

// learnedMax bounds what a shard holds for another until that one takes
// it in (at its next intake: at once if a lookup wakes it, within a second
// otherwise). Beyond it, what loads learned is dropped: the cache is a
// hint, and a load never trusts it.
const learnedMax = 4096

// learnedEntry is a cache entry learned by another shard, with its key's
// hash and the cache epoch it was learned in.
type learnedEntry struct {
	e     cacheEntry
	hash  uint64
	epoch uint64
}

// cacheHits counts the keys of one request that a shard answered from its
// lookup cache, so that it settles them and counts their outcomes once,
// not with an atomic operation per key on memory every owner writes.
type cacheHits struct {
	n      int32
	status [statusKinds]uint64
}

// flush settles and counts r's keys answered from the cache.
func (s *shard) flushHits(r *request) {
	h := &s.hits
	if h.n == 0 {
		return
	}
	s.countCached(r.op, h.status)
	n := h.n
	*h = cacheHits{}
	s.t.settleN(r, n)
}

// countCached counts the outcomes of keys of s answered from its lookup
// cache, c[st] of each status st, with an atomic operation per status, not
// per key; a skipped key was no answer of the cache's.
func (s *shard) countCached(op Op, c [statusKinds]uint64) {
	hits := uint64(0)
	for st, k := range c {
		if k > 0 {
			s.counts.outcomes[op][st].Add(k)
			if Status(st) != StatusSkipped {
				hits += k
			}
		}
	}
	s.t.stats.cacheHits.Add(hits)
}

// shard is one owner goroutine with its backend: the ops of the keys whose
// hash falls to it, their deadlines, the lookup cache and the breaker.
type shard struct {
	t      *Tier
	idx    int
	be     backend
	epoch  time.Time
	exited chan struct{} // closed when the owner has gone
	// ring: an io_uring owner. Loads, stores and deletes may leave it asleep
	// (enqueue), and it lets the caller that hands it loads have the CPU
	// first (loop).
	ring bool

	mu       sync.Mutex // guards the fields up to the blank line
	inbox    []*request
	cancels  []canceled
	learned  []learnedEntry // what loads on other shards learned of this shard's keys (remember)
	spareL   []learnedEntry // owner-only: learned's last backing array, for reuse
	stopping bool           // Close called: finish or cancel what is in flight
	abandon  bool           // Close's deadline passed: give up on the kernel
	beClosed bool           // the backend is closed: nothing may wake it

	work        []*request // requests with keys this shard has not started
	ops         []op
	free        []int32
	inUse       int
	opTime      time.Duration         // a moving average of how long ops take, start to finish (gather)
	stores      int                   // of inUse
	deletes     int                   // of inUse
	lookupsN    int                   // of inUse: lookups
	lookupsMax  int                   // lookupsN at most (io_uring: lookupsMax, or WorkersMax if more)
	aside       int                   // of inUse: loads whose Judge runs aside (io_uring, judgeAside)
	lookups     opIndex               // key hash -> lookup op, to share one op among requests
	cache       map[uint64]cacheEntry // written under cacheMu
	cacheEpoch  uint64                // written under cacheMu
	stuck       int
	opDeadline  time.Time // no op in flight has an earlier deadline: expire skips its scan before it
	breaker     bool
	probing     bool
	closing     bool
	stuckAtExit int
	done        []int32
	spare       []canceled
	hits        cacheHits        // keys of the request being started answered from the cache
	ended       endedKeys        // keys that finishDone's ops answered (endKey), counted and settled at its end
	leads       []*request       // large lookups taken in that this shard leads, not yet dispatched
	touched     map[uint64]int64 // key hash -> when this shard last reported the block used (recency.go)

	counts *keyCounters // this owner's per-key counters, for Stats

	// cacheMu guards the owner's writes of cache and cacheEpoch against a
	// caller that reads them (Tier.answered); the owner, their one writer,
	// reads them without it. learnedN counts the entries of learned not
	// yet in cache: it falls under cacheMu, once they are.
	cacheMu  sync.Mutex
	learnedN atomic.Int32

	loadKeys atomic.Int64  // keys of loads dealt to this shard and not yet answered (Tier.dealLoad)
	inFlight atomic.Int64  // ops in the backend, for Stats
	started  atomic.Uint64 // ops started, for Stats
	queued   atomic.Int64  // requests waiting for op slots, for Stats
	stuckN   atomic.Int64  // for Stats
	open     atomic.Bool   // breaker, for Stats
}

func newShard(t *Tier, idx int) *shard {
	s := &shard{
		t:       t,
		idx:     idx,
		epoch:   time.Now(),
		exited:  make(chan struct{}),
		ring:    t.engine.Kind == EngineURing,
		ops:     make([]op, t.opts.OpsMax),
		lookups: newOpIndex(t.opts.OpsMax),
		cache:   make(map[uint64]cacheEntry),
		touched: make(map[uint64]int64),
		counts:  new(keyCounters),
	}
	s.lookupsMax = len(s.ops)
	if s.ring {
		s.lookupsMax = max(lookupsMax, t.opts.WorkersMax)
	}
	for i := range s.ops {
		s.free = append(s.free, int32(len(s.ops)-1-i))
	}
	return s
}

func (s *shard) enqueue(r *request) {
	s.mu.Lock()
	s.inbox = append(s.inbox, r)
	s.mu.Unlock()
	if r.op != OpLookup && s.awaitsCompletions() && s.be.wakeCalls() {
		// Loads, stores and deletes wait for the next completion to wake
		// the owner, which takes in the inbox at every turn of its loop,
		// at least every lazyWake meanwhile: no wake-up (an eventfd write)
		// in the caller's call, whose woken thread would take the caller's
		// CPU (docs/performance.md; a Go execution trace of a 1.1 ms Load
		// call put all of it inside that write). 64 KiB O_DIRECT stores,
		// batches of 16: the Store call's p99.9 fell from 1.4-5.6 ms to
		// 0.15-0.76 ms (8 interleaved rounds), keys/s and store latency
		// unchanged. Loads alike (tierbench load, 5 interleaved rounds):
		// the Load call's p99.9 64 us against 422 at the median, lower in
		// every round; 1.14x the keys a second (0.80-1.39). Not lookups,
		// whose batches are the scheduler's question of the moment. Behind
		// a hung probe, a store still fails fast
		// (linux_test.TestHungFilesystem). Not the sync engine, whose wake
		// is a channel send: with the lazyWake timer its owner then kept
		// armed, its page-cache loads of 2 MiB ran at 0.80-0.89 of the
		// code before the lazy wake, and at 0.90-1.08 without it (5
		// interleaved rounds; strace counted 553 epoll_pwait calls in
		// 9,600 loads with the timer, none before). Nor an io_uring owner
		// that is running, or asleep on its channel with nothing in the
		// kernel but stores on the store pool: a wake is then a channel
		// send there too, and such a store would otherwise wait for
		// another to finish before it started (64 KiB stores through the
		// page cache on tmpfs, one ring, depth 4, BenchmarkStore, 6
		// interleaved rounds: 1.15x (0.96-1.37) the keys a second of
		// leaving them all for a completion).
		return
	}
	s.be.wake()
}

// awaitsCompletions reports whether the owner has operations in the kernel
// that are not stuck: their completions will wake it.
func (s *shard) awaitsCompletions() bool { return s.inFlight.Load() > s.stuckN.Load() }

// lazyWake bounds an owner's sleep while it awaits completions: how long a
// load, store or delete that did not wake it may wait (enqueue). An owner whose
// operations are all stuck sleeps as long as it likes, and is woken.
const lazyWake = 2 * time.Millisecond

// canceled is a Cancel on its way to an owner: the request may have
// finished, been polled and its slot reused meanwhile, which gen tells.
type canceled struct {
	r   *request
	gen uint64
}

func (s *shard) cancel(r *request, gen uint64) {
	s.mu.Lock()
	s.cancels = append(s.cancels, canceled{r, gen})
	s.mu.Unlock()
	s.be.wake()
}

func (s *shard) stop() {
	select {
	case <-s.exited: // it never started (Open failed), or has finished
		return
	default:
	}
	s.mu.Lock()
	s.stopping = true
	if !s.beClosed {
		s.be.wake()
	}
	s.mu.Unlock()
}

// giveUp tells an owner still waiting for the kernel at Close's deadline
// to stop waiting. An owner that has exited has closed its backend, which
// must not be woken again.
func (s *shard) giveUp() {
	select {
	case <-s.exited:
		return
	default:
	}
	s.mu.Lock()
	s.abandon = true
	if !s.beClosed {
		s.be.wake()
	}
	s.mu.Unlock()
}

// loop is the owner's life: take new work, start what fits, expire
// deadlines, wait for completions; after Close, drain what the kernel
// still holds and release the backend.
func (s *shard) loop() {
	for {
		now := time.Now()
		abandon, yield := s.intake()
		if abandon {
			s.abandonAll()
			break
		}
		if yield && s.ring && s.aside == 0 {
			// The caller whose call woke this owner is likely on this
			// CPU, preempted by the thread it woke (docs/performance.md:
			// this VM's kernel moves no thread to an idle CPU): let it
			// finish its call before this owner's work runs here (what
			// intake took in says when). Not while loads are judged
			// aside: the thread woken to run a checksum is then as likely
			// on this CPU, and a yield to it waits out the checksum. Raw:
			// as a blocking system call, a yield past 20 µs had the
			// runtime's sysmon take this P back (uring.Options.RawSubmit).
			unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
		s.dispatchLeads(now)
		s.startKeys(now)
		next := s.expire(now)
		// Counted here, not at intake: what is left now waits for op
		// slots, and a loop that ends below leaves the count at zero.
		s.queued.Store(int64(len(s.work)))
		if s.closing && s.inUse == 0 && len(s.work) == 0 {
			break
		}
		d := next.Sub(now)
		if s.closing {
			d = min(d, 20*time.Millisecond)
		}
		if s.ring && s.awaitsCompletions() {
			if s.be.sleepsOnKernel() {
				// Not an owner whose ops in flight are all on its
				// store pool: it sleeps on its channel, which every
				// caller wakes, and a 2 ms timer armed at each sleep
				// cost it 0.90x (0.87-0.93) the keys a second
				// (BenchmarkStore, 64 KiB through a tmpfs's page cache,
				// one ring, 4 interleaved rounds).
				d = min(d, lazyWake)
			}
		} else if s.ring && s.inboxWaits() {
			// A load, store or delete that came in after the intake saw
			// operations in the kernel and did not wake this owner; the
			// last of them has completed since, and no completion is
			// left to wake it: take it in now. Its enqueue appended
			// before it looked at inFlight, and this looks at the inbox
			// after inFlight fell, so one of the two sees the other.
			// Without this, 2 MiB stores into a new tree on one ring
			// waited for the owner's next timer, up to a second
			// (BenchmarkStore through a tmpfs's page cache: 15-892 keys/s
			// in 6 runs, 617-676 in 3 with finish's early inFlight alone,
			// 1,070-1,904 in 6 with both; TestLazyWakeTakenIn: 1.0 s
			// without, 3-4 ms with).
			d = 0
		}
		s.done = s.be.wait(max(d, 0), s.done[:0])
		s.finishDone()
	}
	if s.inUse > 0 {
		// Close has given up on these (their keys are answered): it may
		// return now, and this owner waits for the kernel to let go of them
		// before it releases the ring, the descriptors and the buffers.
		s.t.draining.Add(1)
		close(s.exited)
		for s.inUse > 0 {
			s.done = s.be.wait(time.Second, s.done[:0])
			s.finishDone()
		}
		s.closeBackend()
		s.t.drained()
		return
	}
	s.closeBackend()
	close(s.exited)
}

// finishDone finishes the ops in done, and then counts and settles the
// keys they answered (endedKeys).
func (s *shard) finishDone() {
	if len(s.done) == 0 {
		return
	}
	now := time.Now()
	for _, i := range s.done {
		s.finish(i, now)
	}
	s.flushEnded()
}

// endedKeys gathers the keys that a batch of finished ops answered, so
// that their outcomes are counted, and each request's count of keys left
// falls, with an atomic operation per outcome and per request, not per
// key: a lookup's count is shared with the other owners, whose CPUs passed
// its cache line back and forth at every key. Before, a CPU profile of
// BenchmarkLookupOwnCost put 10.8% of the tier's own CPU in that count's
// adds and 8.6% in the 64-bit counters' (the outcomes and the ops
// started); 6 rounds alternating with the code before: 266-299 ns of CPU
// a key against 321-388 (0.78x at the median), 1.18x the keys a second.
// End to end the tier's own work is about a sixth of a warm lookup's CPU:
// BenchmarkLookup (O_PATH, a ring per CPU) could not tell the two apart
// (0.99x the keys a second, 0.985x the CPU a key, 6 rounds).
type endedKeys struct {
	outcomes [opKinds][statusKinds]uint64
	runs     []endedRun
}

// endedRun is n keys of r answered one after another.
type endedRun struct {
	r *request
	n int32
}

// add records one key of r answered with status st.
func (e *endedKeys) add(r *request, st Status) {
	e.outcomes[r.op][st]++
	if k := len(e.runs) - 1; k >= 0 && e.runs[k].r == r {
		e.runs[k].n++
		return
	}
	e.runs = append(e.runs, endedRun{r, 1})
}

// flushEnded counts the gathered outcomes and then settles their keys,
// so that a request's outcomes are counted before it is published.
func (s *shard) flushEnded() {
	e := &s.ended
	if len(e.runs) == 0 {
		return
	}
	for o := range e.outcomes {
		for st, n := range e.outcomes[o] {
			if n > 0 {
				s.counts.outcomes[o][st].Add(n)
				e.outcomes[o][st] = 0
			}
		}
	}
	for _, run := range e.runs {
		s.t.settleN(run.r, run.n)
	}
	clear(e.runs)
	e.runs = e.runs[:0]
}

// closeBackend closes the backend, under mu so that no stop or giveUp
// wakes it afterwards.
func (s *shard) closeBackend() {
	s.mu.Lock()
	s.beClosed = true
	s.be.close()
	s.mu.Unlock()
}

// opStarted, when set (by tests), is called on the owner's goroutine as
// each op starts, before it is prepared.
var opStarted func(s *shard)

// inboxWaits reports whether requests wait in the inbox.
func (s *shard) inboxWaits() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inbox) > 0
}

// intake moves new requests and cancels from the inbox, and reports whether
// Close has given up and whether the owner should yield its CPU before it
// starts them (loop): for loads (not on the store pool, EngineInfo.LoadsSync,
// where they run on no owner: on tmpfs, 4 runs of tierbench load --engine
// all --rounds 3 alternating, a yield made 1.02-1.05x the sync engine's
// keys a second against 1.06x, with no shorter longest call), for stores
// of yieldStores keys or more, and for lookups of yieldLookups keys or
// more. (Requests taken in at a completion, which woke no one, yield
// too.) Each measured with tierbench on ext4, io_uring against the code
// before, runs alternating. Loads (64 KiB O_DIRECT, batches of 16, 5
// rounds): the Load call's p99.9 118-215 us against 182-406; keys/s
// 18-23 k against 19-31 k (two rounds without reached 30 k, none with).
// Lookups (batches of 1,024, --engine all --rounds 3, 8 runs, 4 yielding
// at every intake of lookups, 4 with yieldLookups): the longest call
// 44-265 us against 45-5,750, over 0.9 ms in none of 24 rounds against
// 5; caller p99.9 under 50 us in 21 rounds against 17; keys a second the
// same (1.73-2.65x the sync engine against 1.75-2.59x). Stores (64 KiB
// O_DIRECT, batches of 16, on a nodiscard loop ext4, --engine all --rounds
// 3, 8 runs): the longest call over 0.9 ms in none of 24 rounds against
// 4 (up to 8.8 ms), 111 against 188 us at the median; caller p99.9 62
// against 55 us at the median, under 50 us in 9 rounds either way; keys a
// second 1.18-1.54x the sync engine against 1.10-1.43x, CPU a store the
// same.
func (s *shard) intake() (abandon, yield bool) {
	s.mu.Lock()
	lookups, stores := 0, 0
	for _, r := range s.inbox {
		switch r.op {
		case OpLoad:
			yield = yield || !s.t.engine.LoadsSync
		case OpStore:
			stores += r.n()
		case OpLookup:
			if r.lead == s.idx {
				s.leads = append(s.leads, r)
			}
			if r.lead < 0 || r.lead == s.idx { // not one another owner handed on
				lookups += r.n()
			}
		}
	}
	yield = yield || lookups >= yieldLookups || stores >= yieldStores
	s.work = append(s.work, s.inbox...)
	clear(s.inbox)
	s.inbox = s.inbox[:0]
	cancels := s.cancels
	s.cancels = s.spare[:0]
	learned := s.learned
	s.learned = s.spareL[:0]
	stopping := s.stopping
	abandon = s.abandon
	s.mu.Unlock()

	for _, c := range cancels {
		if c.r.gen.Load() == c.gen {
			s.cancelInFlight(c.r)
		}
	}
	clear(cancels)
	s.spare = cancels
	if stopping && !s.closing {
		s.closing = true
		for i := range s.ops {
			if o := &s.ops[i]; o.inUse && !o.canceled {
				o.canceled = true
				s.be.cancel(int32(i), o)
			}
		}
	}
	e := s.t.cacheEpoch.Load()
	if e != s.cacheEpoch || len(learned) > 0 {
		s.cacheMu.Lock()
		if e != s.cacheEpoch {
			s.cacheEpoch = e
			clear(s.cache)
		}
		// Before any key of the requests just taken starts: a load's
		// outcome is here before its Result is published, so a lookup
		// submitted after the caller polled it sees what the load learned
		// (and one answered in the call waits for it: Tier.answered).
		for _, l := range learned {
			// Not what was learned before InvalidateLookups, nor over what
			// this shard learned since.
			old, ok := s.cache[l.hash]
			if l.epoch == s.cacheEpoch && (!ok || old.at < l.e.at || old.keyLen != l.e.keyLen || old.key != l.e.key) {
				s.cacheStore(l.hash, l.e)
			}
		}
		s.learnedN.Add(-int32(len(learned)))
		s.cacheMu.Unlock()
	}
	s.spareL = learned[:0]
	return abandon, yield
}

// yieldLookups is how many keys of lookups taken in (on every shard) make
// an owner yield its CPU (intake): enough that the path walks outlast a
// call the owner's thread preempted. A round trip of 8 keys
// (BenchmarkLookupRoundTrip), which a yield made 3-6 us slower in 2 of 3
// rounds, does not yield.
const yieldLookups = 128

// yieldStores is how many keys of stores taken in (on every shard) make
// an owner yield its CPU (intake). One store a request does not: the owner's start of it is
// a channel send, and with few stores in flight (ringWriteMin) its yield
// made a store's latency 3.5-3.7 ms at p99 against 2.5 without it and the
// sync engine's 2.5 (tierbench store --batch 1 --depth 4 on a nodiscard
// loop ext4, 3 runs of 3 rounds each way): the yielded owner waited behind
// other threads of its CPU. With every store yielding, 3 runs alternating:
// 0.88x the sync engine's keys a second against 1.04x.
const yieldStores = 4

// cancelInFlight ends r's part in ops already started: shared lookups drop
// r at once; loads and stores ask the kernel and report what it answers.
func (s *shard) cancelInFlight(r *request) {
	for i := range s.ops {
		o := &s.ops[i]
		if !o.inUse || o.abandoned {
			continue
		}
		if o.kind == OpLookup {
			keep := o.waiters[:0]
			for _, w := range o.waiters {
				if w.r == r {
					s.setKey(r, int(w.i), StatusCanceled, ErrCanceled)
				} else {
					keep = append(keep, w)
				}
			}
			clear(o.waiters[len(keep):])
			o.waiters = keep
			continue
		}
		if o.holder == r && !o.canceled {
			o.canceled = true
			s.be.cancel(int32(i), o)
		}
	}
}

// mine reports whether key i of r is this shard's to handle, and if it
// is, the key's hash. Lookups, stores and deletes go by the key's hash, so
// that one shard holds what the tier knows of a key (its lookup cache, the
// lookup in flight that others share). A load needs none of that, so its
// keys go in runs of loadRun to the shards with the fewest load keys
// unanswered (Tier.dealLoad): a batch does not wait for the ring its hashes
// happened to favour, and the copies and checksums of page-cache loads keep
// every CPU busy.
func (s *shard) mine(r *request, i int) (h uint64, ok bool) {
	if r.op == OpLoad && int(r.runs[i/loadRun]) != s.idx {
		return 0, false
	}
	h = r.hash(s.t.seed, i)
	return h, r.op == OpLoad || shardOfHash(h, len(s.t.shards)) == s.idx
}

// hashChunks hashes the chunks of r's keys that no owner has claimed,
// where the owners hash (ownersHash), from the shard's own place in r on:
// an owner that comes late finds its share hashed, and two at once each
// hash half.
func (s *shard) hashChunks(r *request) {
	n := len(r.chunks)
	first := s.idx * n / len(s.t.shards)
	for k := range n {
		ci := (first + k) % n
		c := &r.chunks[ci]
		if c.Load() != chunkFree || !c.CompareAndSwap(chunkFree, chunkClaimed) {
			continue
		}
		lo := ci * hashChunk
		for i := lo; i < min(lo+hashChunk, r.n()); i++ {
			r.ownHashes[i] = maphash.Bytes(s.t.seed, r.key(i))
		}
		c.Store(chunkHashed)
	}
}

// dispatchLeads answers each large lookup this shard leads (request.lead)
// from the shards' caches if they hold every key (Tier.fromCaches), and
// otherwise hands it on to the other shards, first of all, and starts its
// own keys (startPass, where the cache answers what it holds). With the
// lookup cache on, a large batch goes to one owner, which hashes it
// whole: a scheduler asks about the same long prefixes at every step, and
// where the caches answer such a batch, waking every owner to walk it made
// the io_uring engine 0.83x the sync engine's keys a second, whose one
// owner answers it, at 1.26x its CPU a key; led, 1.11x at 0.90x (tierbench
// lookup --cache-ttl 1s --hit-ratio 1, 3 rounds; docs/performance.md,
// seventh sitting). A batch the caches do not answer reaches its other
// owners a hash of its keys later.
func (s *shard) dispatchLeads(now time.Time) {
	if len(s.leads) > 0 && leadDispatching != nil {
		leadDispatching(s)
	}
	n := len(s.t.shards)
	for _, r := range s.leads {
		s.hashChunks(r)
		if s.t.fromCaches(r, 1<<n-1, now, true) {
			r.cursor[s.idx] = int32(r.n()) // startPass lets go of r at once
			s.t.settleN(r, int32(r.n()))   // never the last: s holds r
			continue
		}
		for _, o := range s.t.shards {
			if o != s {
				s.handOn(r, o)
			}
		}
	}
	clear(s.leads)
	s.leads = s.leads[:0]
}

// handOn gives lookup r, which s leads, to shard o, or if o is stopping
// (Close), ends o's keys of r canceled, as o would have.
func (s *shard) handOn(r *request, o *shard) {
	if handedOn != nil {
		handedOn(r, o)
	}
	r.remaining.Add(1) // o's reference
	o.mu.Lock()
	if !o.stopping {
		o.inbox = append(o.inbox, r)
		o.be.wake() // under mu: once o stops, its backend may close (closeBackend)
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	r.remaining.Add(-1) // never the last: s holds r
	n := len(s.t.shards)
	for i := range r.n() {
		if shardOfHash(r.hash(s.t.seed, i), n) == o.idx {
			s.setKey(r, i, StatusCanceled, ErrCanceled)
		}
	}
}

// leadDispatching and handedOn, when set (by tests), are called on the
// owner's goroutine as it dispatches the lookups it leads and as it hands
// one on to shard o.
var (
	leadDispatching func(s *shard)
	handedOn        func(r *request, o *shard)
)

// storesMax is how many stores a shard has in flight at most: reads go to
// the filesystem first, and a burst of stores must not fill the device's
// queue ahead of them. deletesMax is the same for deletes, which come
// last: eviction must not stall the work it makes room for.
//
// lookupsMax is the same for an io_uring ring's lookups (or WorkersMax,
// if more). Warm ones by O_PATH open end inline and never come near it; a
// STATX, or an open the dentry cache cannot answer, waits for a kernel
// worker (at most WorkersMax of them), and more of them in flight only
// queue there, each one's op slot and program one more cold cache line
// for the owner. BenchmarkLookup, STATX with a ring per CPU, 4 interleaved
// rounds: 1.29-1.57x the keys a second of 1,024 in flight per ring
// (0.99-1.16 M against 0.70-0.82 M), 1.09-1.25x the engine's first design
// on two rings, at 1.55-1.80 us of CPU per key against 2.07-2.39; O_PATH
// lookups the same (1.82-1.94 M against 1.78-1.89 M). The sync engine's
// lookups wait for its own workers, and the bound cost it 0.92-0.98x the
// keys a second (3 rounds): it has none.
const (
	storesMax  = 16
	deletesMax = 32
	lookupsMax = 256
)

// startKeys starts the keys of queued requests while ops are free: those
// of lookups and loads first, then those of stores, then deletes.
func (s *shard) startKeys(now time.Time) {
	s.startPass(now, OpLookup)
	s.startPass(now, OpStore)
	s.startPass(now, OpDelete)
}

// passOf is the pass of startKeys that starts a request's keys.
func passOf(o Op) Op {
	if o == OpLoad {
		return OpLookup
	}
	return o
}

// startPass starts the keys of the queued requests of one pass, in the
// order they came, and keeps the rest queued.
func (s *shard) startPass(now time.Time, pass Op) {
	kept := s.work[:0]
	for wi, r := range s.work {
		if passOf(r.op) != pass {
			kept = append(kept, r)
			continue
		}
		i := int(r.cursor[s.idx])
		if i == 0 && len(r.chunks) > 0 {
			s.hashChunks(r)
		}
		for ; i < r.n(); i++ {
			h, mine := s.mine(r, i)
			if !mine {
				continue
			}
			if s.closing || r.canceled.Load() {
				s.setKey(r, i, StatusCanceled, ErrCanceled)
				continue
			}
			if r.prefixOnly && int32(i) > r.firstMiss.Load() {
				s.setKey(r, i, StatusSkipped, nil)
				continue
			}
			if !s.startKey(r, i, h, now) {
				break
			}
		}
		s.flushHits(r)
		r.cursor[s.idx] = int32(i)
		if i == r.n() {
			s.t.settle(r) // the last touch of r
			continue
		}
		kept = append(kept, r)
		if len(s.free) == 0 {
			// Out of ops: keep the rest in order for later.
			kept = append(kept, s.work[wi+1:]...)
			break
		}
	}
	clear(s.work[len(kept):])
	s.work = kept
}

// startKey answers key i of r, of hash h, from memory or starts an op for
// it, and reports false when no op is free.
func (s *shard) startKey(r *request, i int, h uint64, now time.Time) bool {
	key := r.key(i)
	ttl := s.t.opts.LookupCacheTTL
	if ttl > 0 && (r.op == OpLookup || r.op == OpStore) {
		if found, ok := s.cached(h, key, now.Sub(s.epoch)); ok {
			st := StatusPending
			switch {
			case r.op == OpLookup && found:
				st = StatusFound
			case r.op == OpLookup:
				st = StatusMissing
			case found:
				st = StatusPresent // a store of a block known to be there writes nothing
			}
			if st != StatusPending {
				r.res[i] = KeyResult{Status: st}
				s.t.noteMiss(r, i, st)
				s.hits.n++
				s.hits.status[st]++
				return true
			}
		}
	}
	taken := false // an op in flight looks up another key of the same hash
	if r.op == OpLookup {
		if j, ok := s.lookups.get(h); ok {
			o := &s.ops[j]
			same := bytes.Equal(o.keyBytes(), key)
			if same && o.epoch == s.cacheEpoch {
				o.waiters = append(o.waiters, waiter{r, int32(i)})
				if r.deadline.Before(o.deadline) {
					o.deadline = r.deadline
					s.opDeadline = earliest(s.opDeadline, o.deadline)
				}
				s.t.stats.shared.Add(1)
				return true
			}
			// One that started before InvalidateLookups gives its place
			// in the index to this key's new op.
			taken = !same
		}
	}
	if r.op == OpStore && s.t.full(now) {
		s.setKey(r, i, StatusFull, ErrFull)
		return true
	}
	probe := false
	if s.breaker {
		if s.probing {
			s.setKey(r, i, StatusTimedOut, ErrBreakerOpen)
			return true
		}
		probe = true
	}
	if len(s.free) == 0 || r.op == OpStore && s.stores >= storesMax || r.op == OpDelete && s.deletes >= deletesMax ||
		r.op == OpLookup && s.lookupsN >= s.lookupsMax {
		return false
	}
	switch r.op {
	case OpStore:
		s.stores++
	case OpDelete:
		s.deletes++
	case OpLookup:
		s.lookupsN++
	}
	j := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	o := &s.ops[j]
	o.kind = r.op
	o.keyLen = uint8(copy(o.key[:], key))
	o.hash = h
	o.buf, o.holder = nil, nil
	if r.op == OpLoad || r.op == OpStore {
		o.buf, o.holder = r.bufs[i], r
	}
	o.waiters = append(o.waiters[:0], waiter{r, int32(i)})
	o.deadline, o.started, o.epoch = r.deadline, now, s.cacheEpoch
	s.counts.queueWait[r.op].Record(now.Sub(r.submitted))
	s.opDeadline = earliest(s.opDeadline, o.deadline)
	o.inUse, o.abandoned, o.canceled, o.probe = true, false, false, probe
	o.status, o.err = StatusPending, nil
	if probe {
		s.probing = true
	}
	if r.op == OpLookup && !taken {
		s.lookups.put(h, j)
	}
	s.inUse++
	s.inFlight.Store(int64(s.inUse))
	s.started.Add(1)
	if opStarted != nil {
		opStarted(s)
	}
	// Ops that finished inline give their slots back at once, and the
	// next keys take them (s.free is a stack): a batch's opens and reads
	// then cycle through a few slots whose memory is in the CPU's cache,
	// not through all OpsMax of them (BenchmarkLookup, O_PATH, 5
	// interleaved rounds against slots given back after the pass: 1.47x
	// the keys a second with a ring per CPU (0.96-1.56), 1.53x with one
	// (0.78-1.78)).
	s.done = s.be.start(j, o, s.done[:0])
	s.finishDone()
	return true
}

// expire times out keys whose deadline has passed and returns the next
// deadline (at most a second away).
func (s *shard) expire(now time.Time) time.Time {
	next := now.Add(time.Second)
	kept := s.work[:0]
	for _, r := range s.work {
		if r.deadline.After(now) {
			next = earliest(next, r.deadline)
			kept = append(kept, r)
			continue
		}
		for i := int(r.cursor[s.idx]); i < r.n(); i++ {
			if _, mine := s.mine(r, i); mine {
				s.setKey(r, i, StatusTimedOut, ErrTimeout)
			}
		}
		r.cursor[s.idx] = int32(r.n())
		s.t.settle(r)
	}
	clear(s.work[len(kept):])
	s.work = kept

	if s.opDeadline.After(now) {
		return earliest(next, s.opDeadline)
	}
	s.opDeadline = now.Add(time.Hour)
	for j := range s.ops {
		o := &s.ops[j]
		if !o.inUse || o.abandoned {
			continue
		}
		if o.deadline.After(now) {
			next = earliest(next, o.deadline)
			s.opDeadline = earliest(s.opDeadline, o.deadline)
			continue
		}
		// An op whose every waiter times out is stuck, and counted so
		// before any of them is published: a caller that polls a
		// timed-out key finds it in Stats.Stuck.
		stuck := true
		for _, w := range o.waiters {
			stuck = stuck && !w.r.deadline.After(now)
		}
		if stuck {
			s.markStuck(int32(j), o)
		}
		keep := o.waiters[:0]
		o.deadline = now.Add(time.Hour)
		for _, w := range o.waiters {
			if w.r.deadline.After(now) {
				keep = append(keep, w)
				o.deadline = earliest(o.deadline, w.r.deadline)
				continue
			}
			if o.buf != nil {
				s.t.hold(w.r)
			}
			s.setKey(w.r, int(w.i), StatusTimedOut, ErrTimeout)
		}
		clear(o.waiters[len(keep):])
		o.waiters = keep
		if len(keep) > 0 {
			next = earliest(next, o.deadline)
			s.opDeadline = earliest(s.opDeadline, o.deadline)
		}
	}
	return next
}

// markStuck marks op j stuck: it answers nobody until the kernel (or a
// worker) lets go of it.
func (s *shard) markStuck(j int32, o *op) {
	o.abandoned = true
	// A stuck op answers nobody: later lookups of the key start
	// their own (and meet the breaker).
	s.lookups.remove(o.hash, j)
	s.stuck++
	s.stuckN.Store(int64(s.stuck))
	if !o.canceled {
		o.canceled = true
		s.be.cancel(j, o)
	}
	if s.stuck >= s.t.opts.BreakerThreshold && !s.breaker {
		s.breaker = true
		s.open.Store(true)
		s.t.stats.breakerTrips.Add(1)
		s.t.noteBreaker(s.idx, true, s.stuck)
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// finish takes the outcome of op j to its waiters, for finishDone, which
// counts and settles their keys (endKey).
func (s *shard) finish(j int32, now time.Time) {
	o := &s.ops[j]
	took := now.Sub(o.started)
	s.counts.latency[o.kind].Record(took)
	s.opTime += (took - s.opTime) / 16
	switch {
	case o.kind == OpLookup:
		s.lookups.remove(o.hash, j)
	case o.status == StatusStored || o.status == StatusDeleted:
		// This op changed what is at the key's path: a lookup of the key
		// in flight may have looked before, and a lookup that comes after
		// this op's Result must not share its answer.
		if l, ok := s.lookups.get(o.hash); ok && bytes.Equal(s.ops[l].keyBytes(), o.keyBytes()) {
			s.lookups.remove(o.hash, l)
		}
	}
	if o.canceled && o.status == StatusFailed {
		// Canceled (by Cancel or Close) and failed: the cancel is the
		// likely cause (a canceled MKDIRAT makes the OPENAT after it fail
		// with ENOENT); keep the errno for the curious.
		if isCanceled(o.err) {
			o.status, o.err = StatusCanceled, ErrCanceled
		} else {
			o.status, o.err = StatusCanceled, fmt.Errorf("%w: %w", ErrCanceled, o.err)
		}
	}
	if o.kind == OpStore && o.status == StatusFailed && ClassifyFailure(o.err) == FailureNoSpace {
		// The program removed its temporary file: nothing is left.
		o.status = StatusFull
		s.t.noteNoSpace()
	}
	switch o.status {
	case StatusFound, StatusLoaded, StatusPresent:
		s.noteUse(o, now)
	}
	switch {
	case !s.t.capacityOn():
	case o.status == StatusStored:
		s.t.stored(s.t.fileSize())
	case o.status == StatusDeleted:
		s.t.cap.usage.Add(-s.t.fileSize())
	}
	s.remember(o, now)
	if o.probe {
		s.probing = false
		if !o.abandoned {
			s.breaker = false
			s.open.Store(false)
			s.t.noteBreaker(s.idx, false, s.stuck)
		}
	}
	// The slot is counted free before the results go out: a caller that
	// sees one and submits a store sees this op gone, and wakes the owner
	// if it was the last (enqueue).
	o.inUse = false
	s.inUse--
	switch o.kind {
	case OpStore:
		s.stores--
	case OpDelete:
		s.deletes--
	case OpLookup:
		s.lookupsN--
	}
	s.inFlight.Store(int64(s.inUse))
	if o.abandoned {
		s.stuck--
		s.stuckN.Store(int64(s.stuck))
		s.t.stats.late.Add(1)
		if o.buf != nil {
			s.t.unhold(o.holder)
		}
	} else {
		for _, w := range o.waiters {
			s.endKey(w.r, int(w.i), o.status, o.err)
		}
	}
	clear(o.waiters)
	o.waiters = o.waiters[:0]
	o.buf, o.holder, o.err = nil, nil, nil
	s.free = append(s.free, j)
}

// remember updates the lookup cache with what op o learned: this shard's,
// or, for a load dealt here whose key's lookups go to another shard, that
// one's, which takes it in at its next intake.
func (s *shard) remember(o *op, now time.Time) {
	if s.t.opts.LookupCacheTTL <= 0 {
		return
	}
	var found bool
	switch o.status {
	case StatusFound, StatusLoaded, StatusStored, StatusPresent:
		found = true
	case StatusMissing, StatusCorrupt, StatusDeleted:
		found = false
	default:
		return
	}
	// What a lookup or a load found holds as of its start (a load that
	// opened the block before a delete reads it whole and ends after the
	// delete did); what a store or a delete did, as of its end. An entry
	// never replaces a newer one: a load's "found" must not outlive the
	// delete that ended before it, nor make a later store skip its write
	// (StatusPresent).
	if o.kind == OpLookup || o.kind == OpLoad {
		now = o.started
	}
	if o.epoch != s.cacheEpoch {
		return // it started before InvalidateLookups: what it learned may be what the caller undid
	}
	e := cacheEntry{key: o.key, keyLen: o.keyLen, found: found, at: int64(now.Sub(s.epoch))}
	home := s.t.shards[shardOfHash(o.hash, len(s.t.shards))]
	if home == s {
		if old, ok := s.cache[o.hash]; !ok || old.at <= e.at || old.keyLen != e.keyLen || old.key != e.key {
			s.cacheMu.Lock()
			s.cacheStore(o.hash, e)
			s.cacheMu.Unlock()
		}
		return
	}
	e.at = int64(now.Sub(home.epoch))
	home.mu.Lock()
	if len(home.learned) < learnedMax {
		home.learned = append(home.learned, learnedEntry{e, o.hash, o.epoch})
		home.learnedN.Add(1)
	}
	home.mu.Unlock()
}

// cached says whether the lookup cache holds key, of hash h, younger than
// the TTL at age (since the shard's epoch), and if so whether the block was
// found. Inlined: it answers every key of a cached batch.
func (s *shard) cached(h uint64, key []byte, age time.Duration) (found, ok bool) {
	e, ok := s.cache[h]
	return e.found, ok && string(e.key[:e.keyLen]) == string(key) && age-time.Duration(e.at) < s.t.opts.LookupCacheTTL
}

// cacheStore puts e, the entry of the key with hash h, in the lookup
// cache, emptying a full one first. Under cacheMu.
func (s *shard) cacheStore(h uint64, e cacheEntry) {
	if len(s.cache) >= s.t.opts.LookupCacheSize {
		clear(s.cache)
	}
	s.cache[h] = e
}

// abandonAll ends every key still in flight at Close's deadline.
func (s *shard) abandonAll() {
	s.dispatchLeads(time.Now()) // the others are stopping: handOn cancels their keys of the lookups s leads
	for _, r := range s.work {
		for i := int(r.cursor[s.idx]); i < r.n(); i++ {
			if _, mine := s.mine(r, i); mine {
				s.setKey(r, i, StatusCanceled, ErrCanceled)
			}
		}
		r.cursor[s.idx] = int32(r.n())
		s.t.settle(r)
	}
	s.work = s.work[:0]
	s.queued.Store(0)
	err := fmt.Errorf("%w: %w", ErrCanceled, ErrStuck)
	for j := range s.ops {
		o := &s.ops[j]
		if !o.inUse {
			continue
		}
		s.stuckAtExit++
		if !o.abandoned {
			// finish releases its buffer when the kernel answers.
			o.abandoned = true
			s.stuck++
			s.stuckN.Store(int64(s.stuck))
		}
		for _, w := range o.waiters {
			if o.buf != nil {
				s.t.hold(w.r)
			}
			s.setKey(w.r, int(w.i), StatusCanceled, err)
		}
		o.waiters = o.waiters[:0]
	}
}
