package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

// evictBlockSize is the tier's BlockSize when neither --block-size nor a
// data set names one. The evictor never reads a payload; only the
// admission of stores uses the block size, and evict stores nothing.
const evictBlockSize = 4096

// evictProgressEvery is how often evict reports the first scan's progress.
var evictProgressEvery = time.Second // tests shorten it

func evictFlags(fs *flag.FlagSet, c *config) {
	fs.Var(&c.maxSize, "max-size", "evict least recently used blocks of the namespace (--namespace; with --layout vllm the rank directory of --model) while its usage is above this (required)")
	fs.Var(&c.lowSize, "low-size", "with usage above --max-size, evict down to this instead (default: --max-size; 0: every block old enough)")
	fs.DurationVar(&c.minAge, "min-age", 0, "keep blocks used (stored, found, loaded) more recently than this (0: none but those of the last second)")
	fs.Var(&c.blockSize, "block-size", "the tier's block size, which only its admission of stores uses (default: the data set's, as populate recorded it, else 4KiB)")
}

// cmdEvict runs one pass of the tier's evictor on the namespace (with
// --layout vllm, the rank directory): above --max-size it removes the
// least recently used blocks down to --low-size. It fails when another
// process's tier holds the namespace's lease: that one evicts it.
func cmdEvict(ctx context.Context, c *config) error {
	fi, err := os.Stat(c.dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", c.dir)
	}
	low := c.lowSize
	if !c.isSet("low-size") {
		low = c.maxSize
	}
	// The low mark is a share of the capacity and must be positive: for
	// --low-size 0 the smallest share there is, which is 0 bytes.
	lowShare := float64(low) / float64(c.maxSize)
	if lowShare == 0 {
		lowShare = math.SmallestNonzeroFloat64
	}
	// The tier's low mark is int64(capacity × share): round the share up
	// until that is --low-size, not a byte below it.
	for int64(float64(c.maxSize)*lowShare) < int64(low) && lowShare < 1 {
		lowShare = math.Nextafter(lowShare, 2)
	}
	minAge := c.minAge
	if minAge == 0 {
		minAge = -1 // the tier's "none"; its 0 is a default of 10 s
	}
	// A namespace that is not there holds nothing; opening a tier on it
	// would create it.
	if _, err := os.Stat(filepath.Join(c.dir, c.namespace)); errors.Is(err, fs.ErrNotExist) {
		return printEvicted(c, low, tier.Stats{})
	}
	tr, err := tier.Open(c.dir, tier.Options{
		BlockSize:     evictTierBlockSize(c),
		Namespace:     c.namespace,
		Layout:        evictLayout(c),
		Format:        must(c.blockFormat()),
		VLLM:          c.vllm,
		OnCorrupt:     blockstore.CorruptLeave, // it loads nothing: no quarantine directory
		NoDirect:      true,                    // no payload moves: skip the O_DIRECT probe
		Rings:         1,
		Capacity:      int64(c.maxSize),
		HighWatermark: 1, // evict only above --max-size
		LowWatermark:  lowShare,
		EvictMinAge:   minAge,
		EvictInterval: time.Hour, // only the pass EvictNow asks for (and the one at Open)
		TouchInterval: -1,
	})
	if err != nil {
		return err
	}
	defer closeTier(tr)

	stopProgress := func() {}
	if !c.json {
		stopProgress = reportProgress(c, func() (int64, bool) {
			st := tr.Stats()
			return st.ScanBlocks, st.Scans == 0
		})
	}
	err = tr.EvictNow(ctx)
	stopProgress()
	st := tr.Stats()
	if errors.Is(err, tier.ErrNotEvictor) {
		holder := st.EvictorHolder
		if holder == "" {
			holder = "another process"
		}
		return fmt.Errorf("namespace %s in %s: %s holds the evictor's lease and evicts it; nothing done", c.namespace, c.dir, holder)
	}
	if err != nil {
		return err
	}
	if err := closeTier(tr); err != nil {
		return err
	}
	return printEvicted(c, low, st)
}

// printEvicted says what the evictor did, by its tier's counters st.
func printEvicted(c *config, low sizeFlag, st tier.Stats) error {
	used := st.Usage + int64(st.EvictedBytes)
	freed, removed := int64(st.EvictedBytes), int64(st.Evicted)
	if c.json {
		return printJSON(c, struct {
			Command   string `json:"command"`
			Namespace string `json:"namespace"`
			MaxSize   int64  `json:"max_size"`
			LowSize   int64  `json:"low_size"`
			UsedSize  int64  `json:"used_size"`
			FreedSize int64  `json:"freed_size"`
			Removed   int64  `json:"removed"`
		}{"evict", c.namespace, int64(c.maxSize), int64(low), used, freed, removed})
	}
	where := fmt.Sprintf("%s (namespace %s)", c.dir, c.namespace)
	// Blocks used within --min-age, or within the last second (the
	// index keeps recency in whole seconds), are never taken.
	young := ""
	if st.Usage > int64(c.maxSize) {
		young = fmt.Sprintf("; the other blocks were used within the last second or --min-age (%v)", c.minAge)
	}
	switch {
	case removed == 0 && young == "":
		fmt.Fprintf(c.stdout, "%s used in %s, at most %s: nothing to evict\n", humanize.IBytes(uint64(used)), where, humanize.IBytes(uint64(c.maxSize)))
	case removed == 0:
		fmt.Fprintf(c.stdout, "%s used in %s, above %s: nothing evicted; every block was used within the last second or --min-age (%v)\n",
			humanize.IBytes(uint64(used)), where, humanize.IBytes(uint64(c.maxSize)), c.minAge)
	default:
		fmt.Fprintf(c.stdout, "%s used in %s: evicted %s least recently used blocks (%s), now %s%s\n",
			humanize.IBytes(uint64(used)), where, humanize.Comma(removed), humanize.IBytes(uint64(freed)), humanize.IBytes(uint64(st.Usage)), young)
	}
	return nil
}

// evictTierBlockSize is --block-size, else the data set's, else
// evictBlockSize.
func evictTierBlockSize(c *config) int {
	if c.blockSize > 0 {
		return int(c.blockSize)
	}
	if m, err := readManifest(c.dir, c.dataSet()); err == nil && m.BlockSize > 0 {
		return m.BlockSize
	}
	return evictBlockSize
}

// evictLayout is the tier's Layout: unset with --layout vllm, where the
// tier takes the rank directory's own.
func evictLayout(c *config) blockstore.Layout {
	if c.vllm != nil {
		return nil
	}
	return c.blockLayout()
}

// must returns v, for values validated already.
func must[T any](v T, _ error) T { return v }

// reportProgress prints "scanned N blocks" to stderr about once a second
// while poll says the scan runs, until the returned function is called.
func reportProgress(c *config, poll func() (blocks int64, running bool)) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(evictProgressEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if blocks, running := poll(); running {
				fmt.Fprintf(c.stderr, "tierbench %s: scanned %s blocks\n", c.command, humanize.Comma(blocks))
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
