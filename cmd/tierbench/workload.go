package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/tier"
)

// workloadFlags registers the flags of run (withData: it also populates)
// and of lookup, load and store.
func workloadFlags(withData bool) func(*flag.FlagSet, *config) {
	return func(fs *flag.FlagSet, c *config) {
		if withData {
			c.blockSize = defaultBlockSize
			fs.IntVar(&c.blocks, "blocks", defaultBlocks, "number of blocks to populate")
			fs.Var(&c.blockSize, "block-size", "payload size of every block")
			fs.Uint64Var(&c.seed, "seed", 1, "key i is SHA-256(seed || i)")
			fs.BoolVar(&c.keep, "keep", false, "keep the temporary directory (with no --dir)")
		}
		engine := "auto"
		if withData {
			engine = "all"
		}
		fs.StringVar(&c.engine, "engine", engine, "auto, uring, sync, or all (every engine available here)")
		fs.IntVar(&c.batch, "batch", 0, fmt.Sprintf("keys per batch (default %d for lookups, %d for loads and stores)", defaultLookupBatch, defaultIOBatch))
		fs.Float64Var(&c.hitRatio, "hit-ratio", defaultHitRatio, "fraction of lookup and load keys drawn from the populated range; the rest are missing")
		fs.IntVar(&c.depth, "depth", defaultDepth, "batches in flight (submitted, not yet polled)")
		fs.DurationVar(&c.duration, "duration", defaultDuration, "how long each workload submits")
		fs.Int64Var(&c.keys, "keys", 0, "run each workload for this many keys instead of --duration")
		fs.BoolVar(&c.direct, "direct", true, "load with O_DIRECT where the filesystem allows (io_uring engine); --direct=false reads through the page cache")
		fs.BoolVar(&c.cold, "cold", false, "drop the page and dentry caches before each workload (root only)")
		fs.DurationVar(&c.latency, "latency", 0, "serve --dir through a FUSE pass-through adding this latency to every operation (root, /dev/fuse, fusermount3)")
	}
}

// cmdWorkload runs one workload against a populated --dir.
func cmdWorkload(name string) func(context.Context, *config) error {
	return func(ctx context.Context, c *config) error {
		m, err := readManifest(c.dir, c.namespace)
		if err != nil {
			return err
		}
		s := &session{c: c, backing: c.dir, root: c.dir, m: m}
		if !c.json {
			fmt.Fprintf(c.stdout, "tierbench %s: %s in %s (namespace %s): %s blocks of %s\n", name, s.limitText(), c.dir, c.namespace,
				humanize.Comma(int64(m.Blocks)), humanize.IBytes(uint64(m.BlockSize)))
		}
		all, err := s.runEngines(ctx, []string{name})
		if err != nil {
			return err
		}
		if name == "store" {
			if err := writeManifest(c.dir, c.namespace, s.m); err != nil {
				return err
			}
		}
		return s.interrupted(ctx, s.report(all))
	}
}

// runEngines runs the named workloads with each engine --engine names, in
// turn, through the FUSE latency while --latency asks for it.
func (s *session) runEngines(ctx context.Context, names []string) ([]*result, error) {
	unmount, err := s.mountLatency()
	if err != nil {
		return nil, err
	}
	var all []*result
	for _, kind := range s.engines() {
		rs, err := s.runEngine(ctx, kind, names)
		all = append(all, rs...)
		if err != nil {
			unmount()
			return nil, fmt.Errorf("engine %s: %w", kind, err)
		}
	}
	if err := unmount(); err != nil {
		return nil, fmt.Errorf("--latency: unmount: %w", err)
	}
	return all, nil
}

// workloadOps maps a workload's name to the operation it submits.
var workloadOps = map[string]tier.Op{"lookup": tier.OpLookup, "load": tier.OpLoad, "store": tier.OpStore}

// runEngine runs the named workloads, in order, on one tier of engine kind.
func (s *session) runEngine(ctx context.Context, kind tier.EngineKind, names []string) ([]*result, error) {
	depth, ioBatch, bufs := s.c.depth, 0, 0
	for _, n := range names {
		if op := workloadOps[n]; op != tier.OpLookup {
			ioBatch = max(ioBatch, s.batchFor(op))
		}
	}
	bufs = depth * ioBatch
	tr, err := s.openTier(kind, depth, max(ioBatch, s.batchFor(tier.OpLookup)), bufs)
	if err != nil {
		return nil, err
	}
	defer closeTier(tr)
	info := tr.Engine()
	var out []*result
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		op := workloadOps[name]
		batch := s.batchFor(op)
		var w workload
		if op == tier.OpStore {
			w = s.storeWorkload(name, batch)
		} else {
			w = readWorkload(name, op, batch, newKeySet(s.m, s.c.hitRatio))
		}
		if s.c.cold {
			s.dropCaches()
		}
		var bufs [][]byte
		if op != tier.OpLookup {
			bufs = tr.Buffers()
		}
		r := drive(ctx, tr, w, depth, bufs, s.limits())
		r.Engine, r.engineInfo, r.Direct, r.Dir = info.Kind.String(), info, info.Direct && op == tier.OpLoad, s.root
		r.Cold = s.c.cold && s.cold
		out = append(out, r)
	}
	return out, closeTier(tr)
}

// storeWorkload writes new blocks from index s.m.Blocks on, growing the
// data set.
func (s *session) storeWorkload(name string, batch int) workload {
	return workload{name: name, op: tier.OpStore, batch: batch, fill: func(keys, bufs [][]byte) {
		for j := range keys {
			keys[j] = keyOf(keys[j][:0], s.m.Seed, s.m.Blocks)
			stampPayload(bufs[j], s.m.Seed, s.m.Blocks)
			s.m.Blocks++
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
