package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/trace"
	"time"

	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/latency"
	"github.com/uringtier/uringtier/tier"
)

// workload is what one benchmark run submits: an operation, a batch size,
// and how to fill a batch's keys (and, for stores, its buffers).
type workload struct {
	name   string // lookup, load, store, prefix or populate
	op     tier.Op
	prefix bool // lookups stop at the first miss (LookupPrefix)
	batch  int
	// fill sets keys[j] (and prepares bufs[j] for a store) for the next
	// len(keys) keys. keys[j] may be kept by the caller: the tier copies
	// keys at submit.
	fill func(keys [][]byte, bufs [][]byte)
}

// limits say when a workload stops submitting: after keys keys if keys > 0,
// else after duration.
type limits struct {
	keys     int64
	duration time.Duration
	progress func(done int64) // called after each polled result; may be nil
	// interval, if not zero, is how often onInterval receives the
	// figures of the interval just ended.
	interval   time.Duration
	onInterval func(intervalSample)
	// room, if not nil, says how many bytes a writing workload may still
	// write; fewer than need (a batch's) end it early. It is asked again
	// when the bytes submitted since have used that up, or roomEvery later
	// (others write too).
	room func(need int64) int64
}

// roomEvery is how often a writing workload asks limits.room at least.
const roomEvery = 50 * time.Millisecond

// streamShift splits a request ID: the bits from it up name the driver's
// stream among the drivers sharing a tier (driveAll), the bits below it are
// the driver's own seq × depth + slot. 2^48 batches outlast any run.
const streamShift = 48

// inflight is one submitted batch, in the slot its request ID names.
type inflight struct {
	busy  bool
	req   uint64
	start time.Time
	keys  [][]byte
	bufs  [][]byte
}

// driver is the state of one workload's stream of batches, owned by the
// goroutine running driveAll.
type driver struct {
	ctx    context.Context
	tr     *tier.Tier
	w      workload
	depth  int
	lim    limits
	stream uint64     // set before driveAll: request IDs are stream << streamShift + seq × depth + slot
	res    *result    // what drive returns; filled as batches are polled
	slots  []inflight // one per batch in flight; slot s has request IDs ≡ s mod depth (below streamShift)
	free   []int      // slots ready for a batch, the next one last

	seq       uint64    // batches submitted: the next request ID is seq × depth + slot
	submitted int64     // keys submitted
	done      int64     // keys whose results were polled
	inFlight  int       // batches submitted and not yet polled
	firstErr  error     // the first key that failed
	submitErr error     // why submitting stopped early: a failed submit, or no slot left
	halted    bool      // driveAll's until said stop, or limits.room: submit no more
	roomAt    time.Time // when limits.room was last asked
	roomLeft  int64     // what it said, less the bytes submitted since
	ended     bool      // nothing in flight and nothing more to submit: res is final

	start      time.Time     // when the workload began
	deadline   time.Time     // with lim.keys == 0, when submitting stops
	cpuStart   time.Duration // the process's CPU time at the start
	statsStart tier.Stats    // the tier's counters at the start

	// The interval being measured: its start, and the figures then.
	ivStart time.Time
	ivDone  int64
	ivBytes int64
	ivHist  latency.Counts
}

// drive runs w on tr with depth batches in flight until lim says stop,
// then waits for every batch. bufs are depth × w.batch buffers of the
// tier's block size for loads and stores (nil for lookups). Request IDs
// are seq × depth + slot, so a result names its slot without a map.
func drive(ctx context.Context, tr *tier.Tier, w workload, depth int, bufs [][]byte, lim limits) *result {
	d := newDriver(ctx, tr, w, depth, bufs, lim)
	driveAll(ctx, tr, []*driver{d}, nil)
	return d.res
}

// newDriver sets up the slots, each with its keys and its share of bufs,
// all free.
func newDriver(ctx context.Context, tr *tier.Tier, w workload, depth int, bufs [][]byte, lim limits) *driver {
	d := &driver{
		ctx: ctx, tr: tr, w: w, depth: depth, lim: lim,
		res:   &result{Workload: w.name, Batch: w.batch, Depth: depth, BlockSize: tr.BlockSize()},
		slots: make([]inflight, depth),
		free:  make([]int, 0, depth),
	}
	for s := range d.slots {
		d.slots[s].keys = make([][]byte, w.batch)
		if bufs != nil {
			d.slots[s].bufs = bufs[s*w.batch : (s+1)*w.batch]
		}
	}
	for s := depth - 1; s >= 0; s-- {
		d.free = append(d.free, s)
	}
	return d
}

// begin notes the start: the time, the deadline, the tier's counters and
// the CPU time.
func (d *driver) begin(now time.Time) {
	d.start, d.ivStart = now, now
	d.deadline = now.Add(d.lim.duration)
	d.statsStart = d.tr.Stats()
	d.cpuStart = cpuTime()
}

// wake is how long a wait may last without a result: a second, or the
// interval, for the safety timer.
func (d *driver) wake() time.Duration {
	wake := time.Second
	if d.lim.interval > 0 {
		wake = min(wake, d.lim.interval)
	}
	return wake
}

// cpuTime returns the user and system CPU time of the whole process
// (getrusage(2) RUSAGE_SELF): every thread, the tier's ring owners and
// io_uring's kernel workers (io-wq threads belong to the process) among
// them.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mux is several drivers sharing one tier, as the streams of one caller
// (an inference scheduler's lookups, loads and stores) share it: one
// goroutine submits for each, waits on the tier's one Ready, polls, and
// hands every result to the driver whose stream its request ID names.
type mux struct {
	tr          *tier.Tier
	ds          []*driver       // the streams; ds[i].stream differ
	until       func() bool     // if not nil, asked after each round: true stops every driver submitting
	results     []tier.Result   // Poll's destination, reused
	safety      *time.Timer     // wakes the wait when Ready stays quiet
	interrupted <-chan struct{} // ctx.Done() until the interrupt has been handled, then nil
}

// driveAll runs the drivers ds on tr at once, each until its limits say
// stop (or until returns true), then waits for every batch; each driver's
// result is final (finish) when its own last batch has been polled. Their
// streams must differ: a result goes to the driver whose stream its
// request ID names.
func driveAll(ctx context.Context, tr *tier.Tier, ds []*driver, until func() bool) {
	m := &mux{tr: tr, ds: ds, until: until, interrupted: ctx.Done()}
	depth := 0
	wake := time.Second
	now := time.Now()
	for i, d := range ds {
		for _, e := range ds[:i] {
			if e.stream == d.stream {
				panic(fmt.Sprintf("tierbench: two drivers of stream %d", d.stream))
			}
		}
		depth += d.depth
		wake = min(wake, d.wake())
		d.begin(now)
	}
	m.results = make([]tier.Result, depth)
	// Each Result's keys, at their size and written once here: Poll
	// copies a request's key results into them, and its first copy into
	// fresh memory took the page faults inside the timed call (12 µs
	// each on our VMs: a Poll of 1,024-key lookups that took 27 ran for
	// 452 µs).
	batch := 0
	for _, d := range ds {
		batch = max(batch, d.w.batch)
	}
	for i := range m.results {
		keys := make([]tier.KeyResult, batch)
		for j := range keys {
			keys[j] = tier.KeyResult{}
		}
		m.results[i].Keys = keys[:0]
	}
	m.safety = time.NewTimer(wake)
	defer m.safety.Stop()
	m.loop(wake)
}

// loop submits into every free slot of every driver, waits for the tier,
// polls, and again, until no driver submits and nothing is in flight.
func (m *mux) loop(wake time.Duration) {
	for {
		live := 0
		for _, d := range m.ds {
			if d.ended {
				continue
			}
			d.submitFree()
			if d.idle() {
				d.ended = true
				d.finish()
				continue
			}
			live++
		}
		if live == 0 {
			return
		}
		if m.until != nil && m.until() {
			for _, d := range m.ds {
				d.halted = true
			}
		}
		m.wait(wake)
		m.pollAll()
		now := time.Now()
		for _, d := range m.ds {
			if !d.ended {
				d.interval(now, false)
			}
		}
	}
}

// idle reports whether d has nothing in flight and will submit nothing
// more; if that is because every slot's buffers are held, it says so.
func (d *driver) idle() bool {
	if d.inFlight != 0 || d.more(time.Now()) && len(d.free) > 0 {
		return false
	}
	if len(d.free) == 0 && d.submitErr == nil {
		d.submitErr = fmt.Errorf("%s: every batch's buffers are held by a filesystem that does not answer", d.w.name)
	}
	return true
}

// more reports whether another batch may be submitted at now.
func (d *driver) more(now time.Time) bool {
	if d.halted || d.submitErr != nil || d.ctx.Err() != nil {
		return false
	}
	if d.lim.room != nil {
		batch := d.batchBytes()
		if d.roomLeft < batch || now.Sub(d.roomAt) >= roomEvery {
			d.roomAt, d.roomLeft = now, d.lim.room(batch)
		}
		if d.halted = d.roomLeft < batch; d.halted {
			return false
		}
	}
	if d.lim.keys > 0 {
		return d.submitted < d.lim.keys
	}
	return now.Before(d.deadline)
}

// fileBytes is what one block takes on disk, at most: its payload and a
// header.
func (d *driver) fileBytes() int64 { return int64(d.res.BlockSize) + blockstore.HeaderSize }

// batchBytes is what a batch of blocks takes on disk, at most.
func (d *driver) batchBytes() int64 { return int64(d.w.batch) * d.fileBytes() }

// submitFree submits a batch into each free slot while the limits allow
// and the tier accepts.
func (d *driver) submitFree() {
	for len(d.free) > 0 && d.more(time.Now()) {
		if !d.submitNext() {
			return
		}
	}
}

// submitNext fills the next free slot's batch and submits it. It returns
// false when the tier is busy (poll first) or the submit failed
// (submitErr says why).
func (d *driver) submitNext() bool {
	s := d.free[len(d.free)-1]
	sl := &d.slots[s]
	n := d.w.batch
	if d.lim.keys > 0 {
		n = int(min(int64(n), d.lim.keys-d.submitted))
	}
	keys := sl.keys[:n]
	var bufs [][]byte
	if sl.bufs != nil {
		bufs = sl.bufs[:n]
	}
	d.w.fill(keys, bufs)
	req := d.seq*uint64(d.depth) + uint64(s)
	if req>>streamShift != 0 {
		panic(fmt.Sprintf("tierbench: %s: request %d overflows its stream's IDs", d.w.name, req))
	}
	req |= d.stream << streamShift
	var err error
	t0 := time.Now()
	// --trace's region (nothing otherwise). Not StartRegion: while a
	// trace runs it allocates a Region a call, and the page faults of
	// the fresh memory that takes fell in the calls it traced (a page
	// fault costs 12 µs at the median on our VMs).
	trace.WithRegion(context.Background(), "submit", func() { err = d.submit(req, keys, bufs) })
	d.observe(&d.res.submitMax, time.Since(t0))
	if errors.Is(err, tier.ErrBusy) {
		return false // the tier's depth is full: poll first
	}
	if err != nil {
		d.submitErr = fmt.Errorf("%s: submit: %w", d.w.name, err)
		return false
	}
	d.free = d.free[:len(d.free)-1]
	sl.busy, sl.req, sl.start = true, req, t0
	d.seq++
	d.inFlight++
	d.submitted += int64(n)
	d.roomLeft -= int64(n) * d.fileBytes()
	return true
}

// submit hands one batch to the tier with the workload's operation.
func (d *driver) submit(req uint64, keys, bufs [][]byte) error {
	switch {
	case d.w.op == tier.OpLookup && d.w.prefix:
		return d.tr.LookupPrefix(req, keys)
	case d.w.op == tier.OpLookup:
		return d.tr.Lookup(req, keys)
	case d.w.op == tier.OpLoad:
		return d.tr.Load(req, keys, bufs)
	case d.w.op == tier.OpStore:
		return d.tr.Store(req, keys, bufs)
	}
	return nil
}

// collect runs a garbage collection before a measured stretch, as the
// testing package does before a benchmark, so that the set-up's garbage (a
// tier's Open, the key sets) is not collected in it.
func collect() { runtime.GC() }

// observe records dur, the length of one Lookup, Load, Store or Poll call,
// in longest and in the caller's maximum.
func (d *driver) observe(longest *time.Duration, dur time.Duration) {
	*longest = max(*longest, dur)
	d.res.callerMax = max(d.res.callerMax, dur)
	d.res.callerHist.Record(dur)
}

// wait blocks until the tier has results, wake has passed, or the context
// is done; on the first interrupt it cancels every batch in flight, so
// that polling drains them.
func (m *mux) wait(wake time.Duration) {
	m.safety.Reset(wake)
	select {
	case <-m.tr.Ready():
	case <-m.safety.C:
	case <-m.interrupted:
		m.interrupted = nil
		for _, d := range m.ds {
			for s := range d.slots {
				if d.slots[s].busy {
					m.tr.Cancel(d.slots[s].req)
				}
			}
		}
	}
}

// pollAll polls until the tier has nothing more, handing every result to
// its driver. Each Poll call counts as a call of every driver still
// running: it is the one caller's, on behalf of them all.
func (m *mux) pollAll() {
	for {
		var n int
		t0 := time.Now()
		trace.WithRegion(context.Background(), "poll", func() { n = m.tr.Poll(m.results) }) // as submitNext's
		now := time.Now()
		for _, d := range m.ds {
			if !d.ended {
				d.observe(&d.res.pollMax, now.Sub(t0))
			}
		}
		if n == 0 {
			return
		}
		for _, r := range m.results[:n] {
			if d := m.driverOf(r); d != nil {
				d.complete(r, now)
			}
		}
		for _, d := range m.ds {
			if d.lim.progress != nil {
				d.lim.progress(d.done)
			}
		}
	}
}

// driverOf returns the driver whose stream r's request ID names. An
// OpRelease may name none: a batch of an earlier driveAll on this tier got
// its buffers back.
func (m *mux) driverOf(r tier.Result) *driver {
	stream := r.Req >> streamShift
	for _, d := range m.ds {
		if d.stream == stream {
			return d
		}
	}
	if r.Op != tier.OpRelease {
		panic(fmt.Sprintf("tierbench: result for request %d of no stream", r.Req))
	}
	return nil
}

// complete accounts for one polled result and frees its slot, unless the
// kernel still holds the slot's buffers.
func (d *driver) complete(r tier.Result, now time.Time) {
	if r.Op == tier.OpRelease {
		return // a timed-out batch's buffers came back; its slot is free already
	}
	s := int((r.Req & (1<<streamShift - 1)) % uint64(d.depth))
	sl := &d.slots[s]
	if !sl.busy {
		panic(fmt.Sprintf("tierbench: result for request %d in idle slot %d", r.Req, s))
	}
	lat := now.Sub(sl.start)
	d.res.hist.Record(lat)
	d.res.latencyMax = max(d.res.latencyMax, lat)
	d.res.Batches++
	d.account(r.Keys, sl.keys)
	sl.busy = false
	d.inFlight--
	if r.Held == 0 {
		d.free = append(d.free, s)
	}
	// else the kernel still holds this batch's buffers (a hung
	// filesystem): the slot is never reused.
}

// account counts a batch's key results, keys[j] being the key of
// results[j], and keeps the first failure.
func (d *driver) account(results []tier.KeyResult, keys [][]byte) {
	res := d.res
	for j, k := range results {
		res.Keys++
		switch {
		case k.Status == tier.StatusMissing || k.Status == tier.StatusSkipped:
			res.Missing++
		case k.Status == tier.StatusFull:
			res.Full++
		case k.Status.OK():
			res.Found++
			if d.w.op != tier.OpLookup {
				res.bytes += int64(res.BlockSize)
			}
		default:
			res.Errors++
			if d.firstErr == nil {
				d.firstErr = fmt.Errorf("%s: key %x: %w", k.Status, keys[j], k.Err)
			}
		}
	}
	d.done += int64(len(results))
}

// interval hands the figures of the interval that ended at now to
// lim.onInterval, if one is due (or last: the workload's final stretch).
func (d *driver) interval(now time.Time, last bool) {
	if d.lim.interval == 0 || d.lim.onInterval == nil {
		return
	}
	dt := now.Sub(d.ivStart)
	// The last stretch, when the workload drains what is in flight, is
	// reported when it holds keys and lasted at least half an interval:
	// a window of results polled in a few milliseconds is not a rate.
	if dt < d.lim.interval && !(last && d.done > d.ivDone && dt >= d.lim.interval/2) {
		return
	}
	h := d.res.hist
	h.Sub(&d.ivHist)
	g := d.tr.Gauges()
	sec := dt.Seconds()
	d.lim.onInterval(intervalSample{
		Type: "interval", Workload: d.w.name,
		T: now.Sub(d.start).Seconds(), Seconds: sec,
		Keys:        d.done - d.ivDone,
		KeysPerSec:  float64(d.done-d.ivDone) / sec,
		BytesPerSec: float64(d.res.bytes-d.ivBytes) / sec,
		P50US:       us(h.Quantile(0.5)),
		P99US:       us(h.Quantile(0.99)),
		InFlight:    g.InFlight,
		Queued:      g.Queued,
		Batches:     d.inFlight,
	})
	d.ivStart, d.ivDone, d.ivBytes, d.ivHist = now, d.done, d.res.bytes, d.res.hist
}

// finish records the elapsed time since start, the CPU time, the tier's
// counters since newDriver, and the first error, then derives the rates
// and quantiles.
func (d *driver) finish() {
	res := d.res
	now := time.Now()
	res.elapsed = now.Sub(d.start)
	res.cpu = cpuTime() - d.cpuStart
	d.interval(now, true)
	st := d.tr.Stats()
	res.Busy, res.Shared = st.Busy-d.statsStart.Busy, st.Shared-d.statsStart.Shared
	res.KernelSleeps = st.KernelSleeps - d.statsStart.KernelSleeps
	op := d.w.op
	res.opHist = st.Latency[op]
	res.opHist.Sub(&d.statsStart.Latency[op])
	switch {
	case d.submitErr != nil:
		res.FirstError = d.submitErr.Error()
		res.Errors++
	case d.firstErr != nil:
		res.FirstError = d.firstErr.Error()
	}
	res.finish()
}
