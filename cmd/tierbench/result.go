package main

import (
	"slices"
	"time"

	"github.com/uringtier/uringtier/tier"
)

// result is one engine × workload measurement. The JSON fields up to
// caller_max_us are the documented interface; later ones may be added to.
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
	Direct      bool      `json:"direct"`
	Dir         string    `json:"dir"`
	Cold        bool      `json:"cold"`
	SubmitMaxUS float64   `json:"submit_max_us"`
	PollMaxUS   float64   `json:"poll_max_us"`
	FirstError  string    `json:"first_error,omitempty"`
	engineInfo  tier.EngineInfo
	latencies   []time.Duration
	callerMax   time.Duration // the longer of submitMax and pollMax
	submitMax   time.Duration // the longest Lookup, Load or Store call
	pollMax     time.Duration // the longest Poll call
	elapsed     time.Duration
	bytes       int64
	startBusy   uint64
	startShared uint64
}

// latencyUS is a batch latency distribution in microseconds: from the
// submit call to the Poll call that returned the batch's result.
type latencyUS struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// finish computes the derived figures.
func (r *result) finish() {
	r.Seconds = r.elapsed.Seconds()
	if r.Seconds > 0 {
		r.KeysPerSec = float64(r.Keys) / r.Seconds
		r.BytesPerSec = float64(r.bytes) / r.Seconds
	}
	r.CallerMaxUS = us(r.callerMax)
	r.SubmitMaxUS, r.PollMaxUS = us(r.submitMax), us(r.pollMax)
	if len(r.latencies) == 0 {
		return
	}
	slices.Sort(r.latencies)
	r.LatencyUS = latencyUS{
		P50:  us(quantile(r.latencies, 0.50)),
		P99:  us(quantile(r.latencies, 0.99)),
		P999: us(quantile(r.latencies, 0.999)),
		Max:  us(r.latencies[len(r.latencies)-1]),
	}
}

// quantile is the nearest-rank quantile q of sorted.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
