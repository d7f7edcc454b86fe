package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/tier"
)

func populateFlags(fs *flag.FlagSet, c *config) {
	c.blockSize = defaultBlockSize
	fs.IntVar(&c.blocks, "blocks", defaultBlocks, "number of blocks to write")
	fs.Var(&c.blockSize, "block-size", "payload size of every block")
	fs.Uint64Var(&c.seed, "seed", 1, "key i is SHA-256(seed || i), both little-endian uint64")
	c.depth = perOp{all: defaultDepth, allSet: true}
	fs.Var(&c.depth, "depth", "batches in flight")
	fs.StringVar(&c.engine, "engine", "auto", "engine that writes: auto, uring or sync")
	onCorruptFlag(fs, c)
}

// cmdPopulate writes the data set into --dir.
func cmdPopulate(ctx context.Context, c *config) error {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	s := newSession(c, c.dir)
	s.root = c.dir
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

// populate writes keys 0..c.blocks-1 into s.backing and records the
// manifest. It refuses a namespace holding a different data set.
func (s *session) populate(ctx context.Context) (*result, error) {
	c := s.c
	want := manifest{Seed: c.seed, BlockSize: int(c.blockSize)}
	old, err := readManifest(s.backing, c.dataSet())
	switch {
	case errors.Is(err, errNoManifest):
	case err != nil:
		return nil, err
	case old.Seed != want.Seed || old.BlockSize != want.BlockSize:
		return nil, fmt.Errorf("namespace %s in %s already holds a data set of seed %d and %s blocks: use another --namespace or directory",
			c.namespace, s.backing, old.Seed, humanize.IBytes(uint64(old.BlockSize)))
	}
	s.setManifest(want) // stores write from key 0 on
	kind := tier.EngineAuto
	if c.engine != "all" {
		kind, _ = tier.ParseEngine(c.engine)
	}
	batch := defaultIOBatch
	saved := s.root
	s.root = s.backing // populate never goes through the FUSE latency
	depth := s.depthFor("store")
	tr, err := s.openTier(kind, depth, batch, depth*batch, false)
	s.root = saved
	if err != nil {
		return nil, err
	}
	defer closeTier(tr)
	bar := newProgress(c.stderr, int64(c.blocks), "populate", !c.json)
	r := drive(ctx, tr, s.storeWorkload("populate", batch, 0, 1), depth, tr.Buffers(), limits{keys: int64(c.blocks), progress: bar.update})
	bar.finish()
	r.Engine, r.EngineLine, r.Dir = tr.Engine().Kind.String(), engineLine(tr.Engine()), s.backing
	if err := closeTier(tr); err != nil {
		return r, err
	}
	s.setManifest(manifest{Seed: want.Seed, BlockSize: want.BlockSize, Blocks: max(s.stored, old.Blocks)})
	if err := writeManifest(s.backing, c.dataSet(), s.m); err != nil {
		return r, err
	}
	if ctx.Err() != nil {
		return r, fmt.Errorf("populate: interrupted after %d blocks", r.Found)
	}
	return r, nil
}
