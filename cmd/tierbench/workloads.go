package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
	"github.com/uringtier/uringtier/uring"
)

// session is one invocation's data set and where the tier reaches it.
type session struct {
	c       *config
	backing string   // the directory holding the data (--dir or a temporary one)
	root    string   // where tiers open it: backing, or the FUSE mountpoint under --latency
	m       manifest // the data set; m.Blocks grows as stores add blocks
	notes   []string // said once, after the table
	cold    bool     // caches were dropped before the last workload
}

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

func (s *session) batchFor(op tier.Op) int {
	switch {
	case s.c.batch > 0:
		return s.c.batch
	case op == tier.OpLookup:
		return defaultLookupBatch
	default:
		return defaultIOBatch
	}
}

func (s *session) limits() limits {
	if s.c.keys > 0 {
		return limits{keys: s.c.keys}
	}
	return limits{duration: s.c.duration}
}

// openTier opens a tier of the given engine on s.root with bufs aligned
// buffers, filled with pseudo-random bytes for stores.
func (s *session) openTier(kind tier.EngineKind, depth, batch, bufs int) (*tier.Tier, error) {
	tr, err := tier.Open(s.root, tier.Options{
		BlockSize: s.m.BlockSize,
		Namespace: s.c.namespace,
		Engine:    kind,
		Depth:     depth,
		BatchMax:  max(batch, 4096),
		NoDirect:  !s.c.direct,
		Buffers:   bufs,
	})
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

func readWorkload(name string, op tier.Op, batch int, ks *keySet) workload {
	return workload{name: name, op: op, batch: batch, fill: func(keys, _ [][]byte) {
		for j := range keys {
			keys[j] = ks.next()
		}
	}}
}

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

// populate writes keys 0..c.blocks-1 into s.backing and records the
// manifest. It refuses a namespace holding a different data set.
func (s *session) populate(ctx context.Context) (*result, error) {
	c := s.c
	want := manifest{Seed: c.seed, BlockSize: int(c.blockSize)}
	old, err := readManifest(s.backing, c.namespace)
	switch {
	case errors.Is(err, errNoManifest):
	case err != nil:
		return nil, err
	case old.Seed != want.Seed || old.BlockSize != want.BlockSize:
		return nil, fmt.Errorf("namespace %s in %s already holds a data set of seed %d and %s blocks: use another --namespace or directory",
			c.namespace, s.backing, old.Seed, humanize.IBytes(uint64(old.BlockSize)))
	}
	s.m = want // Blocks counts up from 0 as stores are filled
	kind := tier.EngineAuto
	if c.engine != "all" {
		kind, _ = tier.ParseEngine(c.engine)
	}
	batch := defaultIOBatch
	saved := s.root
	s.root = s.backing // populate never goes through the FUSE latency
	tr, err := s.openTier(kind, c.depth, batch, c.depth*batch)
	s.root = saved
	if err != nil {
		return nil, err
	}
	defer closeTier(tr)
	bar := newProgress(c.stderr, int64(c.blocks), "populate", !c.json)
	r := drive(ctx, tr, s.storeWorkload("populate", batch), c.depth, tr.Buffers(), limits{keys: int64(c.blocks), progress: bar.update})
	bar.finish()
	r.Engine, r.engineInfo, r.Dir = tr.Engine().Kind.String(), tr.Engine(), s.backing
	if err := closeTier(tr); err != nil {
		return r, err
	}
	s.m.Blocks = max(s.m.Blocks, old.Blocks)
	if err := writeManifest(s.backing, c.namespace, s.m); err != nil {
		return r, err
	}
	if ctx.Err() != nil {
		return r, fmt.Errorf("populate: interrupted after %d blocks", r.Found)
	}
	return r, nil
}

// mountLatency serves s.backing through faultfs with latency added to
// every operation, and points s.root at the mount. The returned function
// unmounts.
func (s *session) mountLatency() (func() error, error) {
	if s.c.latency == 0 {
		return func() error { return nil }, nil
	}
	if err := faultfs.Available(); err != nil {
		return nil, fmt.Errorf("--latency needs FUSE (root, /dev/fuse and fusermount3 from Debian's fuse3): %w", err)
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

// cmdRun is the default: populate, then every workload with every engine.
func cmdRun(ctx context.Context, c *config) (err error) {
	s := &session{c: c, backing: c.dir}
	if s.backing == "" {
		s.backing, err = os.MkdirTemp("", "tierbench-")
		if err != nil {
			return err
		}
		if c.keep {
			defer fmt.Fprintf(c.stderr, "tierbench: kept %s\n", s.backing)
		} else {
			defer func() {
				if rerr := os.RemoveAll(s.backing); rerr != nil && err == nil {
					err = fmt.Errorf("remove the temporary directory: %w", rerr)
				}
			}()
		}
	} else if err := os.MkdirAll(s.backing, 0o755); err != nil {
		return err
	}
	s.root = s.backing
	pop, err := s.populate(ctx)
	if err != nil {
		return err
	}
	if !c.json {
		printHeader(c.stdout, s, pop)
	}
	unmount, err := s.mountLatency()
	if err != nil {
		return err
	}
	var all []*result
	for _, kind := range s.engines() {
		rs, err := s.runEngine(ctx, kind, []string{"lookup", "load", "store"})
		all = append(all, rs...)
		if err != nil {
			unmount()
			return fmt.Errorf("engine %s: %w", kind, err)
		}
	}
	if err := unmount(); err != nil {
		return fmt.Errorf("--latency: unmount: %w", err)
	}
	return s.interrupted(ctx, s.report(all))
}

// interrupted turns err into "interrupted" after a signal: the results
// printed are partial and the canceled keys counted as errors.
func (s *session) interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.New("interrupted: the results are partial")
	}
	return err
}

// cmdPopulate writes the data set into --dir.
func cmdPopulate(ctx context.Context, c *config) error {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	s := &session{c: c, backing: c.dir, root: c.dir}
	r, err := s.populate(ctx)
	if err != nil {
		return err
	}
	if c.json {
		return s.report([]*result{r})
	}
	fmt.Fprintf(c.stdout, "populated %s namespace %s: %s blocks of %s (keys 0..%d of seed %d) in %.2fs, %s/s, engine %s\n",
		c.dir, c.namespace, humanize.Comma(int64(r.Found)), humanize.IBytes(uint64(s.m.BlockSize)), c.blocks-1, s.m.Seed,
		r.Seconds, humanize.Bytes(uint64(r.BytesPerSec)), r.Engine)
	if r.Errors > 0 {
		fmt.Fprintf(c.stdout, "%d blocks failed: %s\n", r.Errors, r.FirstError)
		return errReported
	}
	return nil
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
		unmount, err := s.mountLatency()
		if err != nil {
			return err
		}
		var all []*result
		for _, kind := range s.engines() {
			rs, err := s.runEngine(ctx, kind, []string{name})
			all = append(all, rs...)
			if err != nil {
				unmount()
				return fmt.Errorf("engine %s: %w", kind, err)
			}
		}
		if err := unmount(); err != nil {
			return fmt.Errorf("--latency: unmount: %w", err)
		}
		if name == "store" {
			if err := writeManifest(c.dir, c.namespace, s.m); err != nil {
				return err
			}
		}
		return s.interrupted(ctx, s.report(all))
	}
}

func (s *session) limitText() string {
	if s.c.keys > 0 {
		return fmt.Sprintf("%s keys per workload", humanize.Comma(s.c.keys))
	}
	return fmt.Sprintf("%v per workload", s.c.duration)
}
