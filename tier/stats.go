package tier

import (
	"bytes"
	"errors"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/latency"
)

const (
	opKinds      = int(OpDelete) + 1
	statusKinds  = int(StatusFull) + 1
	failureKinds = int(FailureStale) + 1
)

// Failure classifies a key that ended StatusFailed by its errno: a full
// disk, a read-only mount, a permission problem and a dying device each
// call for a different remedy.
type Failure uint8

// Failure classes.
const (
	FailureOther      Failure = iota // any other errno
	FailureNoSpace                   // ENOSPC, EDQUOT: the filesystem or the quota is full
	FailureReadOnly                  // EROFS
	FailurePermission                // EACCES, EPERM
	FailureIO                        // EIO: the device or the server failed
	FailureStale                     // ESTALE: an NFS file handle went stale
)

var failureNames = [...]string{"other", "nospace", "readonly", "permission", "io", "stale"}

// String returns the class's name: other, nospace, readonly, permission,
// io or stale.
func (f Failure) String() string {
	if int(f) < len(failureNames) {
		return failureNames[f]
	}
	return "failure?"
}

// ClassifyFailure returns the class of a failed key's error.
func ClassifyFailure(err error) Failure {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return FailureOther
	}
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT:
		return FailureNoSpace
	case syscall.EROFS:
		return FailureReadOnly
	case syscall.EACCES, syscall.EPERM:
		return FailurePermission
	case syscall.EIO:
		return FailureIO
	case syscall.ESTALE:
		return FailureStale
	}
	return FailureOther
}

// statsCounters are the tier's counters, updated atomically by owners and
// callers.
type statsCounters struct {
	requests     [opKinds]atomic.Uint64
	keys         [opKinds]atomic.Uint64
	failures     [opKinds][failureKinds]atomic.Uint64
	request      [opKinds]latency.Histogram // requests: submit to result published
	busy         atomic.Uint64
	cacheHits    atomic.Uint64
	shared       atomic.Uint64
	late         atomic.Uint64
	breakerTrips atomic.Uint64
	held         atomic.Int64
	retries      atomic.Uint64

	quarantined      atomic.Uint64
	quarantineFailed atomic.Uint64
	removed          atomic.Uint64
	removeFailed     atomic.Uint64
	quarantineLogAt  atomic.Int64  // Unix ns of the last quarantine or removal log line
	quarantineQuiet  atomic.Uint64 // quarantines and removals not logged since then
}

// keyCounters are the counters an owner updates for every key, one set
// per shard: owners on different CPUs would otherwise write the same
// cache lines for each key. Stats sums them.
type keyCounters struct {
	outcomes     [opKinds][statusKinds]atomic.Uint64
	latency      [opKinds]latency.Histogram // key operations: start to completion
	queueWait    [opKinds]latency.Histogram // key operations: submit to start
	bytesRead    atomic.Uint64
	bytesWritten atomic.Uint64
	sleeps       atomic.Uint64 // Stats.KernelSleeps
}

// Stats is a snapshot of a tier's counters. Its histograms are
// latency.Counts: quantiles within latency.ErrorBound (1/64) of the exact
// ones, in fixed memory however long the tier runs.
type Stats struct {
	Engine EngineInfo
	// Per request kind (indexed by Op): requests and keys submitted, key
	// outcomes (indexed by Status), and failed keys by class (indexed by
	// Failure).
	Requests [opKinds]uint64
	Keys     [opKinds]uint64
	Outcomes [opKinds][statusKinds]uint64
	Failures [opKinds][failureKinds]uint64
	// Latency is the kernel's (or the sync engine's) time per key
	// operation, from the op's start to its completion being reaped.
	Latency [opKinds]latency.Counts
	// RequestLatency is end to end per request: from the submit call to
	// the Result being ready for Poll.
	RequestLatency [opKinds]latency.Counts
	// QueueWait is per key operation: from the submit call to the op's
	// start (waiting for the owner's turn and a free op slot).
	QueueWait [opKinds]latency.Counts

	BytesRead    uint64 // payload bytes of keys loaded
	BytesWritten uint64 // payload bytes of keys stored
	Busy         uint64 // submits refused with ErrBusy
	CacheHits    uint64 // keys answered from the lookup cache
	Shared       uint64 // lookup keys that joined an op already in flight
	// RingOps counts the key operations each ring started (one entry for
	// the sync engine): lookups, stores and deletes go to a ring by the
	// key's hash, loads in turn.
	RingOps      []uint64
	Late         uint64 // completions that arrived after their deadline
	BreakerTrips uint64 // times the breaker opened
	Gauges              // InFlight, Queued, Stuck, Held, BreakerOpen
	// SubmitRetries counts submissions the kernel refused until
	// completions were reaped (EBUSY, EAGAIN: a full completion queue).
	SubmitRetries uint64
	// KernelSleeps counts the io_uring owners' sleeps on the kernel (the
	// ring's eventfd, or io_uring_enter) while operations of theirs were
	// in it: most end in a wake-up by a completion, often from another
	// CPU. Waits that let completions gather (on FUSE, NFS and unknown
	// filesystems) are not counted. The sync engine counts none.
	KernelSleeps uint64
	// Quarantined counts corrupt block files that loads moved into the
	// quarantine directory; QuarantineFailed those they could not move.
	Quarantined      uint64
	QuarantineFailed uint64
	// Removed counts corrupt block files that loads deleted
	// (blockstore.CorruptRemove); RemoveFailed those they could not.
	Removed      uint64
	RemoveFailed uint64
	// Capacity (Options.Capacity): the bound in bytes; the namespace's
	// usage as this tier last knew it (counted by its evictor, or
	// published by the one holding the lease, plus its own stores since);
	// whether this tier is the evictor, and who is ("host pid N"; empty
	// until known); blocks and bytes this tier evicted; its full scans,
	// the blocks the running or last one has seen, and the directories it
	// re-read since. Stores refused for want of room are
	// Outcomes[OpStore][StatusFull].
	CapacityLimit int64
	Usage         int64
	Evictor       bool
	EvictorHolder string
	Evicted       uint64
	EvictedBytes  uint64
	Scans         uint64
	ScanBlocks    int64
	DirsRescanned uint64
	// Touches counts blocks whose access time this tier set to record a
	// use (TouchInterval); TouchesDropped those it skipped because the
	// toucher was behind.
	Touches        uint64
	TouchesDropped uint64
}

// Gauges are a tier's levels of the moment, as Stats has them. Tier.Gauges
// reads them alone, in a few atomic loads a shard, for a caller that looks
// at them at every step; Stats sums 25 histograms and allocates them.
type Gauges struct {
	InFlight    int  // key operations in the kernel or the sync workers
	Queued      int  // requests waiting for free operation slots
	Stuck       int  // operations past their deadline, not yet answered
	Held        int  // caller buffers the kernel still holds
	BreakerOpen bool // new keys fail fast (ErrBreakerOpen) but for one probe
}

// Gauges returns the tier's levels of the moment.
func (t *Tier) Gauges() Gauges {
	g := Gauges{Held: int(t.stats.held.Load())}
	for _, sh := range t.shards {
		g.InFlight += int(sh.inFlight.Load())
		g.Queued += int(sh.queued.Load())
		g.Stuck += int(sh.stuckN.Load())
		g.BreakerOpen = g.BreakerOpen || sh.open.Load()
	}
	return g
}

// LatencyQuantile returns quantile q (0..1) of op's kernel operation
// latency, within latency.ErrorBound.
func (s *Stats) LatencyQuantile(op Op, q float64) time.Duration {
	return s.Latency[op].Quantile(q)
}

// Stats returns the tier's counters.
func (t *Tier) Stats() Stats {
	s := Stats{Engine: t.Engine(), Gauges: t.Gauges()}
	c := &t.stats
	for o := range opKinds {
		s.Requests[o] = c.requests[o].Load()
		s.Keys[o] = c.keys[o].Load()
		for f := range failureKinds {
			s.Failures[o][f] = c.failures[o][f].Load()
		}
		c.request[o].Load(&s.RequestLatency[o])
	}
	s.Busy, s.CacheHits, s.Shared = c.busy.Load(), c.cacheHits.Load(), c.shared.Load()
	s.Late, s.BreakerTrips = c.late.Load(), c.breakerTrips.Load()
	s.SubmitRetries = c.retries.Load()
	s.Quarantined, s.QuarantineFailed = c.quarantined.Load(), c.quarantineFailed.Load()
	s.Removed, s.RemoveFailed = c.removed.Load(), c.removeFailed.Load()
	cp := &t.cap
	s.CapacityLimit, s.Usage, s.Evictor = cp.limit.Load(), cp.usage.Load(), cp.held.Load()
	if h := cp.holder.Load(); h != nil {
		s.EvictorHolder = *h
	}
	s.Evicted, s.EvictedBytes = cp.evicted.Load(), cp.evictedBytes.Load()
	s.Scans, s.ScanBlocks, s.DirsRescanned = cp.scans.Load(), cp.scanned.Load(), cp.rescanned.Load()
	s.Touches, s.TouchesDropped = cp.touches.Load(), cp.touchDropped.Load()
	for _, sh := range t.shards {
		k := sh.counts
		for o := range opKinds {
			for st := range statusKinds {
				s.Outcomes[o][st] += k.outcomes[o][st].Load()
			}
			k.latency[o].AddTo(&s.Latency[o])
			k.queueWait[o].AddTo(&s.QueueWait[o])
		}
		s.BytesRead += k.bytesRead.Load()
		s.BytesWritten += k.bytesWritten.Load()
		s.KernelSleeps += k.sleeps.Load()
		s.RingOps = append(s.RingOps, sh.started.Load())
	}
	return s
}

// countOutcome counts key outcome st of an op of kind o with error err:
// the outcome, the failure class, the payload bytes moved.
func (s *shard) countOutcome(o Op, st Status, err error) {
	s.counts.outcomes[o][st].Add(1)
	s.countMoved(o, st, err)
}

// countMoved is countOutcome but for the outcome itself: the failure
// class and the payload bytes moved.
func (s *shard) countMoved(o Op, st Status, err error) {
	c, k := &s.t.stats, s.counts
	switch st {
	case StatusLoaded:
		k.bytesRead.Add(uint64(s.t.opts.BlockSize))
	case StatusStored:
		k.bytesWritten.Add(uint64(s.t.opts.BlockSize))
	case StatusFailed:
		c.failures[o][ClassifyFailure(err)].Add(1)
	case StatusFull:
		if err != ErrFull { // the filesystem said so: ENOSPC or EDQUOT
			c.failures[o][FailureNoSpace].Add(1)
		}
	}
}

// noteBreaker logs shard's circuit breaker opening or closing, with the
// operations stuck in it at that moment. The owner calls it.
func (t *Tier) noteBreaker(shard int, open bool, stuck int) {
	if open {
		t.log.Warn("tier: circuit breaker open: the filesystem holds operations past their deadlines; new keys fail fast but for one probe",
			"shard", shard, "stuck", stuck, "threshold", t.opts.BreakerThreshold)
		return
	}
	t.log.Info("tier: circuit breaker closed: a probe was answered in time", "shard", shard, "stuck", stuck)
}

// quarantineLogGap is the least time between two log lines of quarantines
// or removals: a directory of damaged blocks must not flood the log. A line
// says how many went unlogged before it.
const quarantineLogGap = time.Second

// disposalLogged says whether a quarantine or removal may be logged now,
// and if not counts it as unlogged.
func (c *statsCounters) disposalLogged() bool {
	now := time.Now().UnixNano()
	last := c.quarantineLogAt.Load()
	if now-last < int64(quarantineLogGap) || !c.quarantineLogAt.CompareAndSwap(last, now) {
		c.quarantineQuiet.Add(1)
		return false
	}
	return true
}

// noteDisposed counts and logs what a load did with a corrupt block file:
// moved it into the quarantine directory or removed it (d.Action), or
// failed to (d.Err). d.Rel is the block's path under the namespace
// directory and d.Dst the quarantine path (either may end in NULs), cause
// why the load judged the block corrupt. The engines call it once per
// move or removal attempted; it is safe from any goroutine.
func (t *Tier) noteDisposed(d blockstore.Disposal, cause error) {
	c := &t.stats
	done, failed, what := &c.quarantined, &c.quarantineFailed, "moved to the quarantine"
	if d.Action == blockstore.CorruptRemove {
		done, failed, what = &c.removed, &c.removeFailed, "removed"
	}
	if d.Err == nil {
		done.Add(1)
	} else {
		failed.Add(1)
	}
	if !c.disposalLogged() {
		return
	}
	attrs := []any{"path", filepath.Join(t.nsDir, string(trimNUL(d.Rel)))}
	if d.Action == blockstore.CorruptQuarantine {
		attrs = append(attrs, "quarantine", string(trimNUL(d.Dst)))
	}
	attrs = append(attrs, "cause", cause, "unlogged", c.quarantineQuiet.Swap(0))
	if d.Err != nil {
		t.log.Error("tier: corrupt block could not be "+what, append(attrs, "err", d.Err)...)
		return
	}
	t.log.Warn("tier: corrupt block "+what, attrs...)
}

// trimNUL cuts b at its first NUL.
func trimNUL(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
