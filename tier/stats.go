package tier

import (
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	opKinds      = int(OpRelease) + 1
	statusKinds  = int(StatusSkipped) + 1
	latencySlots = 32 // bucket b holds latencies in [2^(b-1), 2^b) microseconds
)

// statsCounters are the tier's counters, updated atomically by owners and
// callers.
type statsCounters struct {
	requests     [opKinds]atomic.Uint64
	keys         [opKinds]atomic.Uint64
	outcomes     [opKinds][statusKinds]atomic.Uint64
	latency      [opKinds][latencySlots]atomic.Uint64
	busy         atomic.Uint64
	cacheHits    atomic.Uint64
	shared       atomic.Uint64
	late         atomic.Uint64
	breakerTrips atomic.Uint64
	held         atomic.Int64
	retries      atomic.Uint64
}

func (c *statsCounters) observe(o Op, d time.Duration) {
	us := uint64(max(d, 0) / time.Microsecond)
	c.latency[o][min(bits.Len64(us), latencySlots-1)].Add(1)
}

// Stats is a snapshot of a tier's counters.
type Stats struct {
	Engine EngineInfo
	// Per request kind (indexed by Op): requests and keys submitted, key
	// outcomes (indexed by Status), and a latency histogram of kernel
	// operations: Latency[op][b] counts operations that took
	// [2^(b-1), 2^b) microseconds (b = 0: under 1 µs).
	Requests [opKinds]uint64
	Keys     [opKinds]uint64
	Outcomes [opKinds][statusKinds]uint64
	Latency  [opKinds][latencySlots]uint64

	Busy         uint64 // submits refused with ErrBusy
	CacheHits    uint64 // keys answered from the lookup cache
	Shared       uint64 // lookup keys that joined an op already in flight
	InFlight     int    // key operations in the kernel or the sync workers
	Queued       int    // requests waiting for free operation slots
	Stuck        int    // operations past their deadline, not yet answered
	Late         uint64 // completions that arrived after their deadline
	Held         int    // caller buffers the kernel still holds
	BreakerOpen  bool   // new keys fail fast (ErrBreakerOpen) but for one probe
	BreakerTrips uint64 // times the breaker opened
	// SubmitRetries counts submissions the kernel refused until
	// completions were reaped (EBUSY, EAGAIN: a full completion queue).
	SubmitRetries uint64
}

// LatencyQuantile returns an upper bound of quantile q (0..1) of op's
// kernel operation latency, from the histogram.
func (s *Stats) LatencyQuantile(op Op, q float64) time.Duration {
	var total uint64
	for _, n := range s.Latency[op] {
		total += n
	}
	if total == 0 {
		return 0
	}
	want := uint64(q*float64(total) + 0.5)
	var seen uint64
	for b, n := range s.Latency[op] {
		seen += n
		if seen >= max(want, 1) {
			return time.Duration(uint64(1)<<b) * time.Microsecond
		}
	}
	return time.Duration(uint64(1)<<(latencySlots-1)) * time.Microsecond
}

// Stats returns the tier's counters.
func (t *Tier) Stats() Stats {
	s := Stats{Engine: t.Engine()}
	c := &t.stats
	for o := range opKinds {
		s.Requests[o] = c.requests[o].Load()
		s.Keys[o] = c.keys[o].Load()
		for st := range statusKinds {
			s.Outcomes[o][st] = c.outcomes[o][st].Load()
		}
		for b := range latencySlots {
			s.Latency[o][b] = c.latency[o][b].Load()
		}
	}
	s.Busy, s.CacheHits, s.Shared = c.busy.Load(), c.cacheHits.Load(), c.shared.Load()
	s.Late, s.BreakerTrips, s.Held = c.late.Load(), c.breakerTrips.Load(), int(c.held.Load())
	s.SubmitRetries = c.retries.Load()
	for _, sh := range t.shards {
		s.InFlight += int(sh.inFlight.Load())
		s.Queued += int(sh.queued.Load())
		s.Stuck += int(sh.stuckN.Load())
		s.BreakerOpen = s.BreakerOpen || sh.open.Load()
	}
	return s
}
