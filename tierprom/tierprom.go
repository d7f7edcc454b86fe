// Package tierprom exports a tier's statistics to Prometheus. A Collector
// reads tier.Stats at each scrape and turns it into metrics named by
// Prometheus conventions: uringtier_…_total counters, _seconds histograms,
// _bytes_total byte counters, gauges for what is in flight now, and
// uringtier_engine_info for the engine in use.
//
// It is a package of its own so that a program embedding the tier does not
// link client_golang unless it asks for the metrics:
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(tierprom.NewCollector(tr, tierprom.Options{}))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// # Histograms
//
// The tier keeps latency in latency.Counts, fine log-linear buckets; a
// scrape folds them into classic Prometheus buckets (Options.Buckets, by
// default 10 µs to 100 s in 1-2.5-5 steps), each fine bucket counted at its
// value (its midpoint). A duration within latency.ErrorBound (1/64) of a
// bucket's bound may be counted on the other side of it; the _sum is within
// the same bound of the exact sum.
//
// Collect costs one tier.Stats call (about 130 KiB copied) and allocates
// the metrics; it never touches the filesystem.
package tierprom

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/uringtier/uringtier/latency"
	"github.com/uringtier/uringtier/tier"
)

// DefaultBuckets are the histograms' upper bounds in seconds: 10 µs (a
// page-cache hit) to 100 s (a hung NFS server), in 1-2.5-5 steps.
var DefaultBuckets = []float64{
	10e-6, 25e-6, 50e-6,
	100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3,
	10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3,
	1, 2.5, 5,
	10, 25, 50,
	100,
}

// Options configure a Collector.
type Options struct {
	// ConstLabels are added to every metric, to tell several tiers of one
	// process apart beyond their namespace (which is always the
	// tier_namespace label).
	ConstLabels prometheus.Labels
	// Buckets are the histograms' upper bounds in seconds, ascending;
	// DefaultBuckets when nil.
	Buckets []float64
}

// ops are the request kinds exported, as the op label.
var ops = []tier.Op{tier.OpLookup, tier.OpLoad, tier.OpStore, tier.OpDelete}

// opStatuses are the key outcomes each request kind can have; others are
// exported only if they are ever counted.
var opStatuses = map[tier.Op][]tier.Status{
	tier.OpLookup: {tier.StatusFound, tier.StatusMissing, tier.StatusTimedOut, tier.StatusFailed, tier.StatusCanceled, tier.StatusSkipped},
	tier.OpLoad:   {tier.StatusLoaded, tier.StatusMissing, tier.StatusCorrupt, tier.StatusTimedOut, tier.StatusFailed, tier.StatusCanceled},
	tier.OpStore:  {tier.StatusStored, tier.StatusPresent, tier.StatusFull, tier.StatusTimedOut, tier.StatusFailed, tier.StatusCanceled},
	tier.OpDelete: {tier.StatusDeleted, tier.StatusMissing, tier.StatusTimedOut, tier.StatusFailed, tier.StatusCanceled},
}

var failures = []tier.Failure{tier.FailureNoSpace, tier.FailureReadOnly, tier.FailurePermission, tier.FailureIO, tier.FailureStale, tier.FailureOther}

// Collector is a prometheus.Collector for one tier. Safe for concurrent
// scrapes.
type Collector struct {
	tr     *tier.Tier
	bounds []float64

	requests, keys, outcomes, failures                 *prometheus.Desc
	readBytes, writtenBytes                            *prometheus.Desc
	busy, cacheHits, shared, late                      *prometheus.Desc
	breakerTrips, quarantined, quarantineFailed        *prometheus.Desc
	ringOps                                            *prometheus.Desc
	removed, removeFailed                              *prometheus.Desc
	inFlight, queued, held, stuck, breakerOpen         *prometheus.Desc
	engineInfo                                         *prometheus.Desc
	capacity, usage, evictor, evicted, evictedBytes    *prometheus.Desc
	scans, dirsRescanned, touches, touchesDropped      *prometheus.Desc
	operationSeconds, requestSeconds, queueWaitSeconds *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector of tr's statistics.
func NewCollector(tr *tier.Tier, opts Options) *Collector {
	labels := prometheus.Labels{"tier_namespace": tr.Namespace()}
	for k, v := range opts.ConstLabels {
		labels[k] = v
	}
	d := func(name, help string, vars ...string) *prometheus.Desc {
		return prometheus.NewDesc("uringtier_"+name, help, vars, labels)
	}
	c := &Collector{tr: tr, bounds: opts.Buckets}
	if c.bounds == nil {
		c.bounds = DefaultBuckets
	}
	c.requests = d("requests_total", "Requests submitted and accepted, by kind.", "op")
	c.keys = d("keys_total", "Keys of the requests submitted, by kind.", "op")
	c.outcomes = d("key_outcomes_total", "Key outcomes, by request kind and status.", "op", "status")
	c.failures = d("key_failures_total", "Keys that failed with an IO error, by request kind and errno class (nospace: ENOSPC or EDQUOT).", "op", "reason")
	c.readBytes = d("read_bytes_total", "Payload bytes of blocks loaded.")
	c.writtenBytes = d("written_bytes_total", "Payload bytes of blocks stored.")
	c.busy = d("busy_submits_total", "Submits refused because Options.Depth requests were in flight (ErrBusy).")
	c.cacheHits = d("lookup_cache_hits_total", "Keys answered from the lookup cache.")
	c.shared = d("shared_lookups_total", "Lookup keys that joined an operation already in flight for the same key.")
	c.late = d("late_completions_total", "Operations the kernel answered after their deadline.")
	c.breakerTrips = d("breaker_trips_total", "Times a circuit breaker opened.")
	c.ringOps = d("ring_operations_total", "Key operations each ring (or the sync engine) started: lookups, stores and deletes by key hash, loads in turn.", "ring")
	c.quarantined = d("quarantined_blocks_total", "Corrupt block files moved into the quarantine directory.")
	c.quarantineFailed = d("quarantine_failures_total", "Corrupt block files that could not be moved into the quarantine directory.")
	c.removed = d("removed_blocks_total", "Corrupt block files that loads removed (OnCorrupt remove).")
	c.removeFailed = d("remove_failures_total", "Corrupt block files that loads could not remove.")
	c.inFlight = d("operations_in_flight", "Key operations in the kernel or the sync engine's workers.")
	c.queued = d("requests_queued", "Requests waiting for free operation slots.")
	c.held = d("buffers_held", "Caller buffers the kernel still holds after their deadline.")
	c.stuck = d("operations_stuck", "Operations past their deadline that the filesystem has not answered.")
	c.breakerOpen = d("breaker_open", "1 while a circuit breaker is open: new keys fail fast but for one probe.")
	c.engineInfo = d("engine_info", "The engine in use, as labels; the value is 1.",
		"engine", "fallback", "rings", "flags", "direct", "no_direct", "fs", "inline")
	c.capacity = d("capacity_bytes", "Options.Capacity (or its share of the filesystem) in bytes; 0: no bound.")
	c.usage = d("usage_bytes", "Bytes of block files in the namespace directory, as this tier last knew them.")
	c.evictor = d("evictor", "1 while this tier holds the directory's eviction lease.")
	c.evicted = d("evicted_blocks_total", "Blocks this tier's evictor removed.")
	c.evictedBytes = d("evicted_bytes_total", "Bytes of the blocks this tier's evictor removed.")
	c.scans = d("evictor_scans_total", "Whole scans of the namespace by this tier's evictor.")
	c.dirsRescanned = d("evictor_dirs_rescanned_total", "Directories this tier's evictor read again because they changed.")
	c.touches = d("touches_total", "Blocks whose access time this tier set to record a use.")
	c.touchesDropped = d("touches_dropped_total", "Uses not recorded because the toucher was behind.")
	c.operationSeconds = d("operation_duration_seconds", "Time of one key operation in the kernel (or a sync worker), from its start to its completion.", "op")
	c.requestSeconds = d("request_duration_seconds", "Time of one request, from the submit call to its result being ready for Poll.", "op")
	c.queueWaitSeconds = d("queue_wait_seconds", "Time a key waited from the submit call until its operation started.", "op")
	return c
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.requests, c.keys, c.outcomes, c.failures, c.readBytes, c.writtenBytes,
		c.busy, c.cacheHits, c.shared, c.late, c.breakerTrips, c.quarantined, c.quarantineFailed, c.ringOps,
		c.removed, c.removeFailed,
		c.inFlight, c.queued, c.held, c.stuck, c.breakerOpen, c.engineInfo,
		c.capacity, c.usage, c.evictor, c.evicted, c.evictedBytes, c.scans, c.dirsRescanned, c.touches, c.touchesDropped,
		c.operationSeconds, c.requestSeconds, c.queueWaitSeconds,
	} {
		ch <- d
	}
}

// Collect reads the tier's statistics and sends them as metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.tr.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, op := range ops {
		name := op.String()
		counter(c.requests, s.Requests[op], name)
		counter(c.keys, s.Keys[op], name)
		valid := map[tier.Status]bool{}
		for _, st := range opStatuses[op] {
			valid[st] = true
		}
		for st := tier.StatusFound; st <= tier.StatusFull; st++ {
			if n := s.Outcomes[op][st]; valid[st] || n > 0 {
				counter(c.outcomes, n, name, st.String())
			}
		}
		for _, f := range failures {
			counter(c.failures, s.Failures[op][f], name, f.String())
		}
		c.histogram(ch, c.operationSeconds, &s.Latency[op], name)
		c.histogram(ch, c.requestSeconds, &s.RequestLatency[op], name)
		c.histogram(ch, c.queueWaitSeconds, &s.QueueWait[op], name)
	}
	counter(c.readBytes, s.BytesRead)
	counter(c.writtenBytes, s.BytesWritten)
	counter(c.busy, s.Busy)
	counter(c.cacheHits, s.CacheHits)
	counter(c.shared, s.Shared)
	counter(c.late, s.Late)
	counter(c.breakerTrips, s.BreakerTrips)
	for i, n := range s.RingOps {
		counter(c.ringOps, n, strconv.Itoa(i))
	}
	counter(c.quarantined, s.Quarantined)
	counter(c.quarantineFailed, s.QuarantineFailed)
	counter(c.removed, s.Removed)
	counter(c.removeFailed, s.RemoveFailed)
	gauge(c.inFlight, float64(s.InFlight))
	gauge(c.queued, float64(s.Queued))
	gauge(c.held, float64(s.Held))
	gauge(c.stuck, float64(s.Stuck))
	gauge(c.breakerOpen, b2f(s.BreakerOpen))
	gauge(c.capacity, float64(s.CapacityLimit))
	gauge(c.usage, float64(s.Usage))
	gauge(c.evictor, b2f(s.Evictor))
	counter(c.evicted, s.Evicted)
	counter(c.evictedBytes, s.EvictedBytes)
	counter(c.scans, s.Scans)
	counter(c.dirsRescanned, s.DirsRescanned)
	counter(c.touches, s.Touches)
	counter(c.touchesDropped, s.TouchesDropped)
	e := s.Engine
	gauge(c.engineInfo, 1, e.Kind.String(), e.Fallback, strconv.Itoa(e.Rings), e.Flags,
		strconv.FormatBool(e.Direct), e.NoDirect, e.FS, strconv.FormatBool(e.Inline))
}

// histogram folds counts into c's bounds and sends the histogram.
func (c *Collector) histogram(ch chan<- prometheus.Metric, d *prometheus.Desc, counts *latency.Counts, labels ...string) {
	buckets := make(map[float64]uint64, len(c.bounds))
	var total uint64
	var sum float64
	b := 0
	for i, n := range counts {
		if n == 0 {
			continue
		}
		v := latency.Value(i).Seconds()
		// Buckets are in ascending order of value, so b only moves up.
		for b < len(c.bounds) && c.bounds[b] < v {
			buckets[c.bounds[b]] = total
			b++
		}
		total += n
		sum += float64(n) * v
	}
	for ; b < len(c.bounds); b++ {
		buckets[c.bounds[b]] = total
	}
	ch <- prometheus.MustNewConstHistogram(d, total, sum, buckets, labels...)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
