package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
	"github.com/uringtier/uringtier/uring"
)

// session is one invocation's data set and where the tier reaches it.
type session struct {
	c         *config
	backing   string   // the directory holding the data (--dir or a temporary one)
	root      string   // where tiers open it: backing, or the FUSE mountpoint under --latency
	m         manifest // the data set; m.Blocks grows as stores add blocks
	storeBase uint64   // the first key index stores write: m.Blocks when the session began storing
	stored    uint64   // keys the session's stores have filled
	notes     []string // said once, after the table
	cold      bool     // caches were dropped before the last workload
	metrics   *tierMetrics
	live      *liveOutput // --interval lines; the results as they come, in a job's process
	intervals []intervalSample
	ratios    []mixRatio    // mixed: what the stores did to the readers, per engine
	barrierIn *bufio.Reader // a job's process: the parent's go-ahead for each workload
	traces    int           // measured stretches traced (--trace)
	missNext  uint64        // with --miss-keys, the next workload's first missing key index
}

func newSession(c *config, backing string) *session {
	s := &session{c: c, backing: backing, metrics: &tierMetrics{}}
	s.live = &liveOutput{s: s}
	return s
}

// setManifest makes m the data set; stores write keys from m.Blocks on.
func (s *session) setManifest(m manifest) {
	s.m, s.storeBase, s.stored = m, m.Blocks, 0
}

// child reports whether this process is one of --jobs.
func (s *session) child() bool { return s.c.jobIndex >= 0 }

func (s *session) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	for _, n := range s.notes {
		if n == msg {
			return
		}
	}
	s.notes = append(s.notes, msg)
}

// engines resolves --engine: "all" is every engine usable here.
func (s *session) engines() []tier.EngineKind {
	if s.c.engine != "all" {
		kind, _ := tier.ParseEngine(s.c.engine) // validated
		return []tier.EngineKind{kind}
	}
	if err := uring.Available(); err != nil {
		s.note("uring engine skipped: %v", err)
		return []tier.EngineKind{tier.EngineSync}
	}
	return []tier.EngineKind{tier.EngineURing, tier.EngineSync}
}

// batchFor returns the batch size of the named workload.
func (s *session) batchFor(name string) int {
	def := defaultIOBatch
	if workloadOps[name] == tier.OpLookup {
		def = defaultLookupBatch
	}
	if name == "prefix" {
		def = defaultChain
	}
	return s.c.batch.get(name, def)
}

// depthFor returns the batches in flight of the named workload.
func (s *session) depthFor(name string) int { return s.c.depth.get(name, defaultDepth) }

func (s *session) limits() limits {
	if s.c.keys > 0 {
		return limits{keys: s.c.keys}
	}
	return limits{duration: s.c.duration}
}

func (s *session) limitText() string {
	text := fmt.Sprintf("%v per workload", s.c.duration)
	if s.c.keys > 0 {
		text = fmt.Sprintf("%s keys per workload", humanize.Comma(s.c.keys))
	}
	if s.c.interleave > 0 {
		text += fmt.Sprintf(" (in %d slices, the engines taking turns)", s.c.interleave)
	}
	names := s.c.workloadNames()
	if !slices.ContainsFunc(names, func(n string) bool { return s.warmup(n) > 0 }) {
		return text
	}
	text += fmt.Sprintf(" after %v of warm-up", s.c.warmup)
	if slices.Contains(names, "store") && s.warmup("store") == 0 {
		text += " (stores: none)"
	}
	return text
}

// warmup returns how long the named workload (in mixed, the readers: "")
// runs, unmeasured, before it is measured: --warmup, but none with --cold
// (a warm-up would fill the caches it dropped), nor for stores run for
// --keys (the data set grows by exactly that many).
func (s *session) warmup(workload string) time.Duration {
	if s.c.cold || (s.c.keys > 0 && workload == "store") {
		return 0
	}
	return s.c.warmup
}

// intervalEvery returns how often a workload reports an interval: --interval,
// or, for --plot alone, often enough to draw a curve.
func (s *session) intervalEvery() time.Duration {
	switch {
	case s.c.interval > 0:
		return s.c.interval
	case s.c.plot != "" && s.c.keys > 0:
		return 250 * time.Millisecond
	case s.c.plot != "":
		return min(max(s.c.duration/40, 50*time.Millisecond), time.Second)
	}
	return 0
}

// openTier opens a tier of the given engine on s.root with bufs aligned
// buffers, filled with pseudo-random bytes for stores; bounded, with the
// capacity the flags ask for (populate writes its data set whole).
func (s *session) openTier(kind tier.EngineKind, depth, batch, bufs int, bounded bool) (*tier.Tier, error) {
	c := s.c
	format, _ := c.blockFormat()                               // validated
	onCorrupt, _ := blockstore.ParseCorruptAction(c.onCorrupt) // validated
	opts := tier.Options{
		BlockSize:        s.m.BlockSize,
		Namespace:        c.namespace,
		Engine:           kind,
		Depth:            depth,
		BatchMax:         max(batch, 4096),
		NoDirect:         !c.direct,
		Buffers:          bufs,
		Rings:            c.rings,
		Lookup:           lookupOps[c.lookupOp],
		OpsMax:           c.opsMax,
		WorkersMax:       c.workersMax,
		SyncWorkers:      c.syncWorkers,
		StoresOnRing:     c.storesOnRing,
		LookupCacheTTL:   cacheTTL(c.cacheTTL),
		Durability:       durabilities[c.durability],
		BreakerThreshold: c.breakerThreshold,
		LookupTimeout:    c.lookupTimeout,
		IOTimeout:        c.ioTimeout,
		Format:           format,
		OnCorrupt:        onCorrupt,
		VLLM:             c.vllm,
	}
	if bounded && (c.capacity > 0 || c.capacityShare > 0) {
		opts.Capacity, opts.CapacityShare, opts.EvictMinAge = int64(c.capacity), c.capacityShare, c.evictMinAge
	}
	tr, err := tier.Open(s.root, opts)
	if err != nil {
		return nil, err
	}
	for i, b := range tr.Buffers() {
		fillRandom(b, s.m.Seed^uint64(i)<<32)
	}
	return tr, nil
}

func closeTier(tr *tier.Tier) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return tr.Close(ctx)
}

// dropCaches empties the page, dentry and inode caches, so that the next
// workload reads from the device: sync, then "3" into
// /proc/sys/vm/drop_caches (proc(5)); root only.
func (s *session) dropCaches() {
	s.cold = false
	syncFS()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		s.note("--cold: cannot drop caches (%v; needs root): caches stayed warm", err)
		return
	}
	s.cold = true
	s.note("--cold: page, dentry and inode caches dropped before each workload")
}

// mountLatency serves s.backing through faultfs with latency added to
// every operation, and points s.root at the mount. The returned function
// unmounts.
func (s *session) mountLatency() (func() error, error) {
	if s.c.latency == 0 {
		return func() error { return nil }, nil
	}
	if err := faultfs.Available(); err != nil {
		return nil, fmt.Errorf("--latency needs FUSE (root and /dev/fuse): %w", err)
	}
	mnt, err := os.MkdirTemp("", "tierbench-fuse-")
	if err != nil {
		return nil, err
	}
	fsys, err := faultfs.Mount(mnt, s.backing, faultfs.Options{})
	if err != nil {
		os.Remove(mnt)
		return nil, fmt.Errorf("--latency: mount FUSE on %s: %w", mnt, err)
	}
	if _, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpAll, Latency: s.c.latency}); err != nil {
		fsys.Unmount()
		os.Remove(mnt)
		return nil, err
	}
	s.root = mnt
	s.note("--latency: %s served through FUSE at %s with %v added to every filesystem operation", s.backing, mnt, s.c.latency)
	return func() error {
		s.root = s.backing
		err := fsys.Unmount()
		if rerr := os.Remove(mnt); err == nil {
			err = rerr
		}
		return err
	}, nil
}

// interrupted turns err into "interrupted" after a signal: the results
// printed are partial and the canceled keys counted as errors.
func (s *session) interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.New("interrupted: the results are partial")
	}
	return err
}

// cacheTTL is the tier's LookupCacheTTL for --cache-ttl: tierbench
// measures the filesystem, so 0 turns the cache off (the tier's 0 is its
// default of a second).
func cacheTTL(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
