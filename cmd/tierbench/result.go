package main

import (
	"time"

	"github.com/uringtier/uringtier/latency"
	"github.com/uringtier/uringtier/tier"
)

// result is one engine × workload measurement, of one job or of all jobs.
// The JSON fields up to caller_max_us are the documented interface; later
// ones may be added to.
type result struct {
	Engine      string    `json:"engine"`
	Workload    string    `json:"workload"`
	Keys        int64     `json:"keys"`
	Batches     int64     `json:"batches"`
	Seconds     float64   `json:"seconds"`
	KeysPerSec  float64   `json:"keys_per_sec"`
	BytesPerSec float64   `json:"bytes_per_sec"`
	Found       int64     `json:"found"`
	Errors      int64     `json:"errors"`
	LatencyUS   latencyUS `json:"latency_us"`
	CallerMaxUS float64   `json:"caller_max_us"`
	Missing     int64     `json:"missing"`
	Batch       int       `json:"batch"`
	Depth       int       `json:"depth"`
	BlockSize   int       `json:"block_size"`
	Busy        uint64    `json:"busy"`
	Shared      uint64    `json:"shared"`
	Direct      bool      `json:"direct"` // the row's payloads moved with O_DIRECT (loads and stores of the tier's buffers)
	Dir         string    `json:"dir"`
	Cold        bool      `json:"cold"`
	SubmitMaxUS float64   `json:"submit_max_us"`
	PollMaxUS   float64   `json:"poll_max_us"`
	FirstError  string    `json:"first_error,omitempty"`
	Type        string    `json:"type"` // "result"
	// Job is the job's index with --jobs, -1 on a row that sums Jobs jobs.
	Job  int    `json:"job"`
	Jobs int    `json:"jobs"`
	Dist string `json:"dist"`
	// EngineLine says what the engine had in force (engineLine).
	EngineLine string `json:"engine_line"`
	// CPU time of the whole process (user + system, io_uring's kernel
	// workers included) while the workload ran, per key and per payload
	// byte moved.
	CPUSeconds   float64 `json:"cpu_seconds"`
	CPUUSPerKey  float64 `json:"cpu_us_per_key"`
	CPUNSPerByte float64 `json:"cpu_ns_per_byte"`
	// KernelSleeps counts the io_uring owners' sleeps on the kernel while
	// the workload ran (tier.Stats.KernelSleeps; 0 on the sync engine), per
	// key in KernelSleepsPerKey: the wake-ups a key cost.
	KernelSleeps       uint64  `json:"kernel_sleeps"`
	KernelSleepsPerKey float64 `json:"kernel_sleeps_per_key"`
	// OpLatencyUS is the tier's own figure: one key operation in the
	// kernel (or a sync worker), from its start to its completion.
	OpLatencyUS latencyUS `json:"op_latency_us"`
	// LatencyHist is the batch latency histogram behind latency_us, as
	// [lower bound ns, count] pairs (latency.Counts), so that runs and
	// jobs can be merged.
	LatencyHist *latency.Counts `json:"latency_hist"`
	// OpLatencyHist is the histogram behind op_latency_us.
	OpLatencyHist *latency.Counts `json:"op_latency_hist"`
	// CallerUS is the distribution of single Lookup, Load, Store and Poll
	// calls (its max is caller_max_us), CallerHist the histogram behind it.
	CallerUS   latencyUS       `json:"caller_us"`
	CallerHist *latency.Counts `json:"caller_hist"`
	// Phase is mixed's phase: "baseline" (the mix without its stores) or
	// "mixed" (with them); Streams how many streams of the workload the
	// row sums, each with Depth batches in flight.
	Phase   string `json:"phase,omitempty"`
	Streams int    `json:"streams,omitempty"`
	// Full counts stores the tier refused for want of room (StatusFull:
	// the namespace at its --capacity, every block too young to evict,
	// or the filesystem full); not errors.
	Full int64 `json:"full"`
	// Evicted and EvictedBytes are the blocks and bytes the tier's
	// evictor removed during the workload (in a mixed phase, on its store
	// row); Evictor whether this job's tier held the namespace's lease,
	// so was the one evicting (on a sum of jobs: any of them).
	Evicted      uint64 `json:"evicted"`
	EvictedBytes uint64 `json:"evicted_bytes"`
	Evictor      bool   `json:"evictor"`
	// Round is which of --rounds measured the row, from 1.
	Round int `json:"round"`
	// Stopped says why a store workload stopped before its --duration or
	// --keys: the filesystem's free space under --keep-free. The row
	// counts the keys stored until then, none if it was under at the start.
	Stopped string `json:"stopped,omitempty"`

	hist       latency.Counts // batch latencies: submit call to the Poll that returned the result
	opHist     latency.Counts // the tier's kernel operation latencies during the workload
	callerHist latency.Counts // single submit and Poll calls
	latencyMax time.Duration  // the longest batch, exactly
	callerMax  time.Duration  // the longer of submitMax and pollMax
	submitMax  time.Duration  // the longest Lookup, Load or Store call
	pollMax    time.Duration  // the longest Poll call
	elapsed    time.Duration
	cpu        time.Duration
	bytes      int64
}

// latencyUS is a latency distribution in microseconds: for batches, from
// the submit call to the Poll call that returned the batch's result.
// Quantiles are within latency.ErrorBound (1/64) of the exact ones; Max
// is exact where the run measured it, else within the same bound.
type latencyUS struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

func quantiles(h *latency.Counts, exactMax time.Duration) latencyUS {
	if h.Total() == 0 {
		return latencyUS{}
	}
	mx := exactMax
	if mx == 0 {
		mx = h.Max()
	}
	return latencyUS{
		P50:  us(min(h.Quantile(0.50), mx)),
		P99:  us(min(h.Quantile(0.99), mx)),
		P999: us(min(h.Quantile(0.999), mx)),
		Max:  us(mx),
	}
}

// finish computes the derived figures.
func (r *result) finish() {
	r.Type = "result"
	if r.Jobs == 0 {
		r.Jobs = 1
	}
	if r.Round == 0 {
		r.Round = 1
	}
	r.Seconds = r.elapsed.Seconds()
	if r.Seconds > 0 {
		r.KeysPerSec = float64(r.Keys) / r.Seconds
		r.BytesPerSec = float64(r.bytes) / r.Seconds
	}
	r.CallerMaxUS = us(r.callerMax)
	r.SubmitMaxUS, r.PollMaxUS = us(r.submitMax), us(r.pollMax)
	r.CPUSeconds = r.cpu.Seconds()
	if r.Keys > 0 {
		r.CPUUSPerKey = us(r.cpu) / float64(r.Keys)
		r.KernelSleepsPerKey = float64(r.KernelSleeps) / float64(r.Keys)
	}
	if r.bytes > 0 {
		r.CPUNSPerByte = float64(r.cpu.Nanoseconds()) / float64(r.bytes)
	}
	r.LatencyUS = quantiles(&r.hist, r.latencyMax)
	r.OpLatencyUS = quantiles(&r.opHist, 0)
	r.LatencyHist, r.OpLatencyHist = &r.hist, &r.opHist
	r.CallerUS, r.CallerHist = quantiles(&r.callerHist, r.callerMax), &r.callerHist
}

// intervalSample is the figures of one interval of a workload (--interval).
type intervalSample struct {
	Type        string  `json:"type"` // "interval"
	Engine      string  `json:"engine"`
	Workload    string  `json:"workload"`
	Job         int     `json:"job"`
	T           float64 `json:"t"`       // seconds from the workload's start to the interval's end
	Seconds     float64 `json:"seconds"` // the interval's length
	Keys        int64   `json:"keys"`    // keys polled in the interval
	KeysPerSec  float64 `json:"keys_per_sec"`
	BytesPerSec float64 `json:"bytes_per_sec"`
	P50US       float64 `json:"p50_us"` // batch latency of the batches polled in the interval
	P99US       float64 `json:"p99_us"`
	InFlight    int     `json:"in_flight"`         // the tier's key operations in flight at the interval's end
	Queued      int     `json:"queued"`            // requests waiting for operation slots then
	Batches     int     `json:"batches_in_flight"` // batches submitted and not yet polled then
	Phase       string  `json:"phase,omitempty"`   // mixed: the phase
	Stream      int     `json:"stream,omitempty"`  // mixed: which of the workload's streams
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// evictions attributes a tier's evictions to the workloads run on it in
// turn: each result gets those since the previous one's end (the first,
// those since the tier opened, whose evictor starts with a pass).
type evictions struct {
	blocks, bytes uint64 // the tier's counters when the last result was noted
}

// note sets r's eviction figures from tr's counters.
func (e *evictions) note(r *result, tr *tier.Tier) {
	st := tr.Stats()
	r.Evicted, r.EvictedBytes, r.Evictor = st.Evicted-e.blocks, st.EvictedBytes-e.bytes, st.Evictor
	e.blocks, e.bytes = st.Evicted, st.EvictedBytes
}
