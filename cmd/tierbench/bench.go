package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

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
}

// inflight is one submitted batch, in the slot its request ID names.
type inflight struct {
	busy  bool
	req   uint64
	start time.Time
	keys  [][]byte
	bufs  [][]byte
}

// driver is the state of one drive call, owned by the goroutine running it.
type driver struct {
	ctx     context.Context
	tr      *tier.Tier
	w       workload
	depth   int
	lim     limits
	res     *result       // what drive returns; filled as batches are polled
	slots   []inflight    // one per batch in flight; slot s has request IDs ≡ s mod depth
	free    []int         // slots ready for a batch, the next one last
	results []tier.Result // Poll's destination, reused

	seq       uint64 // batches submitted: the next request ID is seq × depth + slot
	submitted int64  // keys submitted
	done      int64  // keys whose results were polled
	inFlight  int    // batches submitted and not yet polled
	firstErr  error  // the first key that failed
	submitErr error  // why submitting stopped early: a failed submit, or no slot left

	start       time.Time       // when the workload began
	deadline    time.Time       // with lim.keys == 0, when submitting stops
	safety      *time.Timer     // wakes the wait when Ready stays quiet
	interrupted <-chan struct{} // ctx.Done() until the interrupt has been handled, then nil
	cpuStart    time.Duration   // the process's CPU time at the start
	statsStart  tier.Stats      // the tier's counters at the start

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
	d.start = time.Now()
	d.ivStart = d.start
	d.deadline = d.start.Add(lim.duration)
	wake := time.Second
	if lim.interval > 0 {
		wake = min(wake, lim.interval)
	}
	d.safety = time.NewTimer(wake)
	defer d.safety.Stop()
	d.loop(wake)
	d.finish()
	return d.res
}

// newDriver sets up the slots, each with its keys and its share of bufs,
// all free, and notes the tier's counters and the CPU time at the start.
func newDriver(ctx context.Context, tr *tier.Tier, w workload, depth int, bufs [][]byte, lim limits) *driver {
	d := &driver{
		ctx: ctx, tr: tr, w: w, depth: depth, lim: lim,
		res:         &result{Workload: w.name, Batch: w.batch, Depth: depth, BlockSize: tr.BlockSize()},
		slots:       make([]inflight, depth),
		free:        make([]int, 0, depth),
		results:     make([]tier.Result, depth),
		interrupted: ctx.Done(),
	}
	d.statsStart = tr.Stats()
	for s := range d.slots {
		d.slots[s].keys = make([][]byte, w.batch)
		if bufs != nil {
			d.slots[s].bufs = bufs[s*w.batch : (s+1)*w.batch]
		}
	}
	for s := depth - 1; s >= 0; s-- {
		d.free = append(d.free, s)
	}
	d.cpuStart = cpuTime()
	return d
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

// loop submits into every free slot, waits for the tier, polls, and again,
// until submitting has stopped and nothing is in flight.
func (d *driver) loop(wake time.Duration) {
	for {
		d.submitFree()
		if d.inFlight == 0 && (!d.more(time.Now()) || len(d.free) == 0) {
			if len(d.free) == 0 && d.submitErr == nil {
				d.submitErr = fmt.Errorf("%s: every batch's buffers are held by a filesystem that does not answer", d.w.name)
			}
			return
		}
		d.wait(wake)
		d.pollAll()
		d.interval(time.Now(), false)
	}
}

// more reports whether another batch may be submitted at now.
func (d *driver) more(now time.Time) bool {
	if d.submitErr != nil || d.ctx.Err() != nil {
		return false
	}
	if d.lim.keys > 0 {
		return d.submitted < d.lim.keys
	}
	return now.Before(d.deadline)
}

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
	t0 := time.Now()
	err := d.submit(req, keys, bufs)
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
func (d *driver) wait(wake time.Duration) {
	d.safety.Reset(wake)
	select {
	case <-d.tr.Ready():
	case <-d.safety.C:
	case <-d.interrupted:
		d.interrupted = nil
		for s := range d.slots {
			if d.slots[s].busy {
				d.tr.Cancel(d.slots[s].req)
			}
		}
	}
}

// pollAll polls until the tier has nothing more, completing every result.
func (d *driver) pollAll() {
	for {
		t0 := time.Now()
		n := d.tr.Poll(d.results)
		now := time.Now()
		d.observe(&d.res.pollMax, now.Sub(t0))
		if n == 0 {
			return
		}
		for _, r := range d.results[:n] {
			d.complete(r, now)
		}
		if d.lim.progress != nil {
			d.lim.progress(d.done)
		}
	}
}

// complete accounts for one polled result and frees its slot, unless the
// kernel still holds the slot's buffers.
func (d *driver) complete(r tier.Result, now time.Time) {
	if r.Op == tier.OpRelease {
		return // a timed-out batch's buffers came back; its slot is free already
	}
	s := int(r.Req % uint64(d.depth))
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
	st := d.tr.Stats()
	sec := dt.Seconds()
	d.lim.onInterval(intervalSample{
		Type: "interval", Workload: d.w.name,
		T: now.Sub(d.start).Seconds(), Seconds: sec,
		Keys:        d.done - d.ivDone,
		KeysPerSec:  float64(d.done-d.ivDone) / sec,
		BytesPerSec: float64(d.res.bytes-d.ivBytes) / sec,
		P50US:       us(h.Quantile(0.5)),
		P99US:       us(h.Quantile(0.99)),
		InFlight:    st.InFlight,
		Queued:      st.Queued,
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
