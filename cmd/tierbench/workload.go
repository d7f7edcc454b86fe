package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/tier"
	"golang.org/x/sys/unix"
)

// workloadFlags registers the flags of run (withData: it also populates)
// and of lookup, load, store, prefix and mixed.
func workloadFlags(withData bool) func(*flag.FlagSet, *config) {
	return func(fs *flag.FlagSet, c *config) {
		if withData {
			c.blockSize = defaultBlockSize
			fs.IntVar(&c.blocks, "blocks", defaultBlocks, "number of blocks to populate")
			fs.Var(&c.blockSize, "block-size", "payload size of every block")
			fs.Uint64Var(&c.seed, "seed", 1, "key i is SHA-256(seed || i)")
			fs.BoolVar(&c.keep, "keep", false, "keep the temporary directory (with no --dir)")
			fs.StringVar(&c.workloads, "workloads", "lookup,load,store", "the workloads to run, in order: lookup, load, store, prefix")
		}
		engine := "auto"
		if withData {
			engine = "all"
		}
		fs.StringVar(&c.engine, "engine", engine, "auto, uring, sync, or all (every engine available here)")
		fs.Var(&c.batch, "batch", fmt.Sprintf("keys per batch: N, or per workload as lookup=N,load=N,... (default %d for lookups and prefix chains, %d for loads and stores)", defaultLookupBatch, defaultIOBatch))
		fs.Float64Var(&c.hitRatio, "hit-ratio", defaultHitRatio, "fraction of lookup and load keys drawn from the populated range; the rest are missing (prefix: the fraction of chains present whole)")
		fs.IntVar(&c.missKeys, "miss-keys", defaultMissKeys, "lookups and loads: each workload's misses are this many keys of its own, in turn, after those of the workloads before it in this process (32 bytes each, made before it starts; default: 65,536 shared by every workload); more than a workload draws makes every miss a name not looked up before in this process")
		c.depth = perOp{all: defaultDepth, allSet: true}
		fs.Var(&c.depth, "depth", "batches in flight (submitted, not yet polled): N, or per workload as lookup=N,load=N,...")
		fs.DurationVar(&c.duration, "duration", defaultDuration, "how long each workload submits")
		fs.Int64Var(&c.keys, "keys", 0, "run each workload for this many keys instead of --duration")
		fs.BoolVar(&c.direct, "direct", true, "load and store with O_DIRECT where the filesystem allows (both engines); --direct=false goes through the page cache")
		fs.BoolVar(&c.cold, "cold", false, "drop the page and dentry caches before each workload (root only)")
		fs.DurationVar(&c.warmup, "warmup", defaultWarmup, "run each workload this long before measuring it; not with --cold, nor for stores with --keys (a fresh tier's first calls touch fresh memory: page faults; 0: none)")
		fs.DurationVar(&c.latency, "latency", 0, "serve --dir through a FUSE pass-through adding this latency to every operation (root and /dev/fuse)")

		fs.StringVar(&c.dist, "dist", "uniform", "key distribution: uniform (each key in turn), zipf (--zipf-s), hot (--hot-keys, --hot-share)")
		fs.Float64Var(&c.zipfS, "zipf-s", 1.1, "zipf: the skew s > 1 (rank r is picked with probability ∝ 1/r^s)")
		fs.Float64Var(&c.hotKeys, "hot-keys", 0.1, "hot: the fraction of the data set that is hot")
		fs.Float64Var(&c.hotShare, "hot-share", 0.9, "hot: the fraction of picks that go to the hot keys")

		fs.IntVar(&c.rings, "rings", 0, "tier option Rings: io_uring instances (0: the tier's default, GOMAXPROCS up to 8)")
		fs.StringVar(&c.lookupOp, "lookup-op", "openpath", "tier option Lookup: the io_uring lookup operation, openpath, statx or mixed")
		fs.IntVar(&c.opsMax, "ops-max", 0, "tier option OpsMax: key operations in flight per ring (0: 1024)")
		fs.IntVar(&c.workersMax, "workers-max", 0, "tier option WorkersMax: kernel worker threads per ring (0: 64)")
		fs.IntVar(&c.syncWorkers, "sync-workers", 0, "tier option SyncWorkers: the sync engine's goroutines, and the io_uring engine's store pool's on a local filesystem (0: 16)")
		fs.BoolVar(&c.storesOnRing, "stores-on-ring", false, "tier option StoresOnRing: the io_uring engine stores through its rings on a local filesystem too, not with plain system calls on its store pool")
		fs.DurationVar(&c.cacheTTL, "cache-ttl", 0, "tier option LookupCacheTTL: answer a lookup from memory this long (0: no cache)")
		fs.StringVar(&c.durability, "durability", "none", "tier option Durability of stores: none, data (fsync the file) or full (and its directory)")
		fs.IntVar(&c.breakerThreshold, "breaker-threshold", 0, "tier option BreakerThreshold: stuck operations that open the breaker (0: 64)")
		fs.DurationVar(&c.lookupTimeout, "lookup-timeout", 0, "tier option LookupTimeout (0: 5s)")
		fs.DurationVar(&c.ioTimeout, "io-timeout", 0, "tier option IOTimeout for loads and stores (0: 30s)")
		onCorruptFlag(fs, c)
		fs.Var(&c.capacity, "capacity", "tier option Capacity: bound the namespace's block files to this size; the tier evicts the least recently used, and stores it cannot admit end full, not failed (0: no bound)")
		fs.Float64Var(&c.capacityShare, "capacity-share", 0, "tier option CapacityShare: the bound as a fraction of the filesystem's size instead of --capacity")
		fs.Float64Var(&c.keepFree, "keep-free", 0.05, "a store workload stops early once less than this fraction of the filesystem is free, so that a long or repeated run cannot fill the disk (0: never)")
		fs.DurationVar(&c.evictMinAge, "evict-min-age", 0, "tier option EvictMinAge: blocks used more recently are never evicted (0: the tier's 10s; negative: none)")

		fs.DurationVar(&c.interval, "interval", 0, "print a line every interval (keys/s, bytes/s, p50, p99, in flight); with --json, an object")
		fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics during the run (e.g. :9090; with --jobs, job j on port+j)")
		fs.StringVar(&c.plot, "plot", "", "draw throughput and latency over time and the latency distributions into this .png or .svg file")
		fs.StringVar(&c.trace, "trace", "", "write a Go execution trace of each measured workload to FILE.WORKLOAD.ENGINE.N, its Submit and Poll calls as regions (go tool trace FILE...)")
		fs.IntVar(&c.jobs, "jobs", 1, "processes, each with its own tier, on the one directory (as tensor-parallel ranks or servers sharing it)")
		fs.IntVar(&c.jobIndex, "job-index", -1, "")
		fs.IntVar(&c.interleave, "interleave", 0, "with --engine all: run each workload in this many slices per engine, the engines taking turns slice by slice on tiers open at once, so that each meets the machine and the filesystem as the other does (this VM's speed drifts from minute to minute; an ext4 without a journal makes stores after mass deletes dearer for minutes); 0: each engine's workloads in turn")
		fs.IntVar(&c.rounds, "rounds", 1, "run every engine this many times, in turn and in alternating order, and print the first engine's figures divided by the other's: the median of the rounds' ratios, with their range (with --json, an engine_ratio object per workload)")
	}
}

// hiddenFlags are set by tierbench for its own child processes.
var hiddenFlags = map[string]bool{"job-index": true}

// cmdWorkload runs one workload against a populated --dir.
func cmdWorkload(name string) func(context.Context, *config) error {
	return func(ctx context.Context, c *config) error {
		s, err := populatedSession(c)
		if err != nil {
			return err
		}
		if !c.json && !s.child() {
			fmt.Fprintf(c.stdout, "tierbench %s: %s in %s (namespace %s): %s blocks of %s%s\n", name, s.limitText(), c.dir, c.namespace,
				humanize.Comma(int64(s.m.Blocks)), humanize.IBytes(uint64(s.m.BlockSize)), s.jobsText())
		}
		all, err := s.runWorkloads(ctx, []string{name})
		if err != nil {
			return err
		}
		if name == "store" && !s.child() {
			if err := writeManifest(c.dir, c.dataSet(), s.m); err != nil {
				return err
			}
		}
		return s.interrupted(ctx, s.report(all))
	}
}

// populatedSession returns a session on --dir's data set, as populate
// recorded it.
func populatedSession(c *config) (*session, error) {
	m, err := readManifest(c.dir, c.dataSet())
	if err != nil {
		return nil, err
	}
	s := newSession(c, c.dir)
	s.root = c.dir
	s.setManifest(m)
	return s, nil
}

// runWorkloads runs the named workloads: in this process, or in --jobs
// processes.
func (s *session) runWorkloads(ctx context.Context, names []string) ([]*result, error) {
	stop, err := s.serveMetrics()
	if err != nil {
		return nil, err
	}
	defer stop()
	if slices.Contains(names, "store") && !s.child() {
		s.noteStoreMount()
	}
	if s.c.jobs > 1 && !s.child() {
		return s.runJobs(ctx, names)
	}
	if s.c.interleave > 0 {
		return s.runEngines(func(kinds []tier.EngineKind) ([]*result, error) { return s.runInterleaved(ctx, kinds, names) })
	}
	return s.runEngines(inTurn(func(kind tier.EngineKind) ([]*result, error) { return s.runEngine(ctx, kind, names) }))
}

// runEngines runs runRound (the named workloads, or the mix) with the
// engines --engine names, --rounds times, each time in the other order,
// through the FUSE latency while --latency asks for it.
func (s *session) runEngines(runRound func(kinds []tier.EngineKind) ([]*result, error)) ([]*result, error) {
	unmount, err := s.mountLatency()
	if err != nil {
		return nil, err
	}
	var all []*result
	kinds := s.engines()
	for round := 1; round <= max(s.c.rounds, 1); round++ {
		rs, err := runRound(kinds)
		for _, r := range rs {
			r.Round = round
		}
		all = append(all, rs...)
		if err != nil {
			unmount()
			return nil, err
		}
		// Who runs first meets the filesystem as the last run left it
		// (a store after a store, ext4 after mass deletes): take turns.
		slices.Reverse(kinds)
	}
	if err := unmount(); err != nil {
		return nil, fmt.Errorf("--latency: unmount: %w", err)
	}
	return all, nil
}

// inTurn makes a round of runEngine with each engine, one after the other.
func inTurn(runEngine func(tier.EngineKind) ([]*result, error)) func([]tier.EngineKind) ([]*result, error) {
	return func(kinds []tier.EngineKind) ([]*result, error) {
		var out []*result
		for _, kind := range kinds {
			rs, err := runEngine(kind)
			out = append(out, rs...)
			if err != nil {
				return out, fmt.Errorf("engine %s: %w", kind, err)
			}
		}
		return out, nil
	}
}

// workloadOps maps a workload's name to the operation it submits.
var workloadOps = map[string]tier.Op{"lookup": tier.OpLookup, "load": tier.OpLoad, "store": tier.OpStore, "prefix": tier.OpLookup}

// runEngine runs the named workloads, in order, on one tier of engine kind.
func (s *session) runEngine(ctx context.Context, kind tier.EngineKind, names []string) ([]*result, error) {
	tr, err := s.openFor(kind, names)
	if err != nil {
		return nil, err
	}
	defer closeTier(tr)
	s.metrics.set(tr)
	defer s.metrics.set(nil)
	info := tr.Engine()
	var out []*result
	var ev evictions
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		op, depth := workloadOps[name], s.depthFor(name)
		w := s.newWorkload(name)
		if s.c.cold {
			s.dropCaches()
		}
		var bufs [][]byte
		if op != tier.OpLookup {
			bufs = tr.Buffers()
		}
		lim := s.limits()
		var stopped string
		if name == "store" {
			lim.room = s.room(name, &stopped)
		}
		if warm := s.warmup(name); warm > 0 {
			drive(ctx, tr, w, depth, bufs, limits{duration: warm, room: lim.room})
		}
		if err := s.barrier(info.Kind.String(), name); err != nil {
			return out, err
		}
		if iv := s.intervalEvery(); iv > 0 {
			engine := info.Kind.String()
			lim.interval = iv
			lim.onInterval = func(smp intervalSample) {
				smp.Engine, smp.Job = engine, max(s.c.jobIndex, 0)
				s.interval(smp)
			}
		}
		collect()
		stopTrace, err := s.startTrace(name, info.Kind.String())
		if err != nil {
			return out, err
		}
		r := drive(ctx, tr, w, depth, bufs, lim)
		if err := stopTrace(); err != nil {
			return out, err
		}
		s.label(r, info)
		r.Stopped = stopped
		ev.note(r, tr)
		if name == "store" {
			s.m.Blocks = max(s.m.Blocks, s.storeBase+s.stored)
		}
		out = append(out, r)
		s.emit(r)
	}
	if ctx.Err() == nil {
		// Every job has read its tier's figures before any job closes
		// its tier: a Close gives up the evictor's lease, and the job
		// that looks next would take it and report it too.
		if err := s.barrier(info.Kind.String(), "close"); err != nil {
			closeTier(tr)
			return out, err
		}
	}
	return out, closeTier(tr)
}

// openFor opens a tier of engine kind sized for the named workloads: the
// deepest and widest, and buffers for the largest load or store.
func (s *session) openFor(kind tier.EngineKind, names []string) (*tier.Tier, error) {
	depthMax, batchMax, bufs := 0, 0, 0
	for _, n := range names {
		depth, batch := s.depthFor(n), s.batchFor(n)
		depthMax, batchMax = max(depthMax, depth), max(batchMax, batch)
		if workloadOps[n] != tier.OpLookup {
			bufs = max(bufs, depth*batch)
		}
	}
	return s.openTier(kind, depthMax, batchMax, bufs, true)
}

// room returns limits.room for a writing workload with --keep-free: the
// bytes free on the filesystem under the data set beyond that share of
// it (dfSpace). The first time the room falls short of what is needed, it
// says why in *stopped (the row's Stopped) and on stderr at once.
func (s *session) room(name string, stopped *string) func(need int64) int64 {
	keep := s.c.keepFree
	if keep == 0 {
		return nil
	}
	return func(need int64) int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(s.root, &st); err != nil {
			return math.MaxInt64 // not ours to judge: the stores will say what is wrong
		}
		free, size := dfSpace(&st)
		left := free - int64(keep*float64(size))
		if left < need && *stopped == "" {
			*stopped = fmt.Sprintf("%s free of %s on the filesystem of %s, under --keep-free %g",
				humanize.IBytes(uint64(free)), humanize.IBytes(uint64(size)), s.root, keep)
			fmt.Fprintf(s.c.stderr, "tierbench: %s stopped early: %s\n", name, *stopped)
		}
		return left
	}
}

// dfSpace returns a filesystem's free bytes and its size as df counts it,
// used plus available: space reserved for root or held back from this
// user is neither (a host whose disk keeps a large reserve would otherwise
// look full from the start).
func dfSpace(st *unix.Statfs_t) (free, size int64) {
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks-st.Bfree+st.Bavail) * st.Bsize
}

// newWorkload returns the named workload with its --batch: stores of new
// keys (this job's share), prefix chains, or lookups or loads of keys
// drawn from a key set of its own.
func (s *session) newWorkload(name string) workload {
	op, batch := workloadOps[name], s.batchFor(name)
	switch name {
	case "store":
		return s.storeWorkload(name, batch, uint64(max(s.c.jobIndex, 0)), uint64(s.c.jobs))
	case "prefix":
		ks := s.newKeySet()
		return workload{name: name, op: op, prefix: true, batch: batch, fill: func(keys, _ [][]byte) { ks.chain(keys) }}
	}
	return readWorkload(name, op, batch, s.newKeySet())
}

// newKeySet makes a lookup or load workload's key set. Its misses are the
// default's 65,536 shared by every workload, or with --miss-keys that many
// of its own, after the previous workloads' in this process.
func (s *session) newKeySet() *keySet {
	if !s.c.isSet("miss-keys") {
		return newKeySet(s.m, s.c.hitRatio, s.dist(), missingBase, defaultMissKeys)
	}
	from := missingBase + s.missNext
	s.missNext += uint64(s.c.missKeys)
	return newKeySet(s.m, s.c.hitRatio, s.dist(), from, s.c.missKeys)
}

// label fills in what a result of r.Workload on the tier info describes
// ran with: the engine, the directory, the caches, the job, the keys.
func (s *session) label(r *result, info tier.EngineInfo) {
	r.Engine, r.EngineLine, r.Dir = info.Kind.String(), engineLine(info), s.root
	op := workloadOps[r.Workload]
	r.Direct = info.Direct && (op == tier.OpLoad || op == tier.OpStore)
	r.Cold = s.c.cold && s.cold
	r.Job, r.Dist = max(s.c.jobIndex, 0), s.dist().String()
}

// storeWorkload writes new blocks: key s.storeBase + off + i × stride for
// i = 0, 1, …, so that --jobs processes (off = the job's index, stride =
// the number of jobs) store different keys.
func (s *session) storeWorkload(name string, batch int, off, stride uint64) workload {
	return workload{name: name, op: tier.OpStore, batch: batch, fill: func(keys, bufs [][]byte) {
		for j := range keys {
			i := s.storeBase + off + s.stored*stride
			keys[j] = keyOf(keys[j][:0], s.m.Seed, i)
			stampPayload(bufs[j], s.m.Seed, i)
			s.stored++
		}
	}}
}

// readWorkload looks up or loads keys drawn from ks.
func readWorkload(name string, op tier.Op, batch int, ks *keySet) workload {
	return workload{name: name, op: op, batch: batch, fill: func(keys, _ [][]byte) {
		for j := range keys {
			keys[j] = ks.next()
		}
	}}
}

// dist returns the key distribution the flags ask for.
func (s *session) dist() distribution {
	c := s.c
	return distribution{name: c.dist, zipfS: c.zipfS, hotKeys: c.hotKeys, hotShare: c.hotShare}
}

// jobsText says how many jobs run, if more than one.
func (s *session) jobsText() string {
	if s.c.jobs <= 1 {
		return ""
	}
	return fmt.Sprintf("; %d jobs, each its own process and tier", s.c.jobs)
}
