package main

import (
	"encoding/json"

	"github.com/uringtier/uringtier/tier"
)

// engineInfo is tier.EngineInfo as ut_engine's JSON.
type engineInfo struct {
	Kind     string `json:"kind"`      // "uring" or "sync"
	Fallback string `json:"fallback"`  // why auto chose sync; "" otherwise
	Rings    int    `json:"rings"`     // io_uring instances
	Flags    string `json:"flags"`     // io_uring setup flags in force
	Direct   bool   `json:"direct"`    // loads and stores of page-aligned buffers use O_DIRECT
	NoDirect string `json:"no_direct"` // why not, when direct is false
	FS       string `json:"fs"`        // the filesystem under the namespace directory
	Inline   bool   `json:"inline"`    // reads and writes may complete in the owner thread
	// OwnThreads: each ring's owner keeps a thread of its own
	OwnThreads bool `json:"own_threads"`
	// StoresSync: stores run as plain syscalls on a pool of goroutines (a local filesystem)
	StoresSync bool `json:"stores_sync"`
	// LoadsSync: loads run on that pool too (tmpfs)
	LoadsSync bool `json:"loads_sync"`
	// LastPageApart: O_DIRECT loads read each block's last page apart first (a FUSE server that miscounts reads at a file's end)
	LastPageApart bool `json:"last_page_apart"`
}

func newEngineInfo(e tier.EngineInfo) engineInfo {
	return engineInfo{Kind: e.Kind.String(), Fallback: e.Fallback, Rings: e.Rings, Flags: e.Flags,
		Direct: e.Direct, NoDirect: e.NoDirect, FS: e.FS, Inline: e.Inline, OwnThreads: e.OwnThreads, StoresSync: e.StoresSync, LoadsSync: e.LoadsSync,
		LastPageApart: e.LastPageApart}
}

func engineJSON(e tier.EngineInfo) []byte {
	b, _ := json.Marshal(newEngineInfo(e)) // cannot fail: strings, ints and bools
	return b
}

// opStats is one request kind's counters in ut_stats's JSON.
type opStats struct {
	Requests uint64            `json:"requests"` // requests submitted
	Keys     uint64            `json:"keys"`     // keys submitted
	Outcomes map[string]uint64 `json:"outcomes"` // keys per status name, zero counts left out
	P50US    int64             `json:"p50_us"`   // kernel operation latency, median, within 1/64 (tier.Stats.LatencyQuantile)
	P99US    int64             `json:"p99_us"`   // same, 99th percentile
	P999US   int64             `json:"p99_9_us"` // same, 99.9th percentile
}

// stats is tier.Stats as ut_stats's JSON, with names instead of indices.
type stats struct {
	Namespace    string             `json:"namespace"` // the directory under the root holding the blocks (layout=vllm: the rank directory)
	Engine       engineInfo         `json:"engine"`
	Ops          map[string]opStats `json:"ops"` // "lookup", "load", "store", "delete"
	Busy         uint64             `json:"busy"`
	CacheHits    uint64             `json:"cache_hits"`
	Shared       uint64             `json:"shared"`
	InFlight     int                `json:"in_flight"`
	RingOps      []uint64           `json:"ring_ops"` // key operations each ring started (one entry for the sync engine)
	Queued       int                `json:"queued"`
	Stuck        int                `json:"stuck"`
	Late         uint64             `json:"late"`
	Held         int                `json:"held"`
	BreakerOpen  bool               `json:"breaker_open"`
	BreakerTrips uint64             `json:"breaker_trips"`
	// Corrupt block files that loads moved into the quarantine, or removed
	// (on_corrupt), and those they could not.
	Quarantined      uint64 `json:"quarantined"`
	QuarantineFailed uint64 `json:"quarantine_failed"`
	Removed          uint64 `json:"removed"`
	RemoveFailed     uint64 `json:"remove_failed"`
	// Capacity (tier.Stats): the bound and the usage in bytes, the
	// evictor, what this tier evicted and scanned, and the access times it
	// set to record hits. Stores refused for want of room are the store
	// outcome "full".
	CapacityLimit  int64  `json:"capacity_limit"`
	Usage          int64  `json:"usage"`
	Evictor        bool   `json:"evictor"`
	EvictorHolder  string `json:"evictor_holder"`
	Evicted        uint64 `json:"evicted"`
	EvictedBytes   uint64 `json:"evicted_bytes"`
	Scans          uint64 `json:"scans"`
	ScanBlocks     int64  `json:"scan_blocks"`
	DirsRescanned  uint64 `json:"dirs_rescanned"`
	Touches        uint64 `json:"touches"`
	TouchesDropped uint64 `json:"touches_dropped"`
}

func statsJSON(ns string, s tier.Stats) []byte {
	out := stats{
		Namespace: ns, Quarantined: s.Quarantined, QuarantineFailed: s.QuarantineFailed, Removed: s.Removed, RemoveFailed: s.RemoveFailed,
		Engine: newEngineInfo(s.Engine), Ops: make(map[string]opStats),
		Busy: s.Busy, CacheHits: s.CacheHits, Shared: s.Shared, InFlight: s.InFlight, RingOps: s.RingOps, Queued: s.Queued,
		Stuck: s.Stuck, Late: s.Late, Held: s.Held, BreakerOpen: s.BreakerOpen, BreakerTrips: s.BreakerTrips,
		CapacityLimit: s.CapacityLimit, Usage: s.Usage, Evictor: s.Evictor, EvictorHolder: s.EvictorHolder,
		Evicted: s.Evicted, EvictedBytes: s.EvictedBytes, Scans: s.Scans, ScanBlocks: s.ScanBlocks,
		DirsRescanned: s.DirsRescanned, Touches: s.Touches, TouchesDropped: s.TouchesDropped,
	}
	for _, op := range []tier.Op{tier.OpLookup, tier.OpLoad, tier.OpStore, tier.OpDelete} {
		o := opStats{
			Requests: s.Requests[op], Keys: s.Keys[op], Outcomes: make(map[string]uint64),
			P50US:  s.LatencyQuantile(op, 0.5).Microseconds(),
			P99US:  s.LatencyQuantile(op, 0.99).Microseconds(),
			P999US: s.LatencyQuantile(op, 0.999).Microseconds(),
		}
		for st, n := range s.Outcomes[op] {
			if n > 0 {
				o.Outcomes[tier.Status(st).String()] = n
			}
		}
		out.Ops[op.String()] = o
	}
	b, _ := json.Marshal(out) // cannot fail: maps with string keys, numbers
	return b
}
