package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/blockstore"
)

func evictFlags(fs *flag.FlagSet, c *config) {
	fs.Var(&c.maxSize, "max-size", "evict least recently used blocks (all namespaces) until usage is at most this (required)")
	fs.Var(&c.lowSize, "low-size", "with usage above --max-size, evict down to this instead (default: --max-size)")
}

// cmdEvict removes least recently used blocks, over every namespace, down
// to --max-size (or --low-size).
func cmdEvict(_ context.Context, c *config) error {
	s, err := openStore(c)
	if err != nil {
		return err
	}
	low := c.lowSize
	if !c.isSet("low-size") {
		low = c.maxSize
	}
	st, err := s.Evict(blockstore.EvictOptions{HighWatermarkSize: int64(c.maxSize), LowWatermarkSize: int64(low)})
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(c, struct {
			Command   string `json:"command"`
			MaxSize   int64  `json:"max_size"`
			LowSize   int64  `json:"low_size"`
			UsedSize  int64  `json:"used_size"`
			FreedSize int64  `json:"freed_size"`
			Removed   int64  `json:"removed"`
		}{"evict", int64(c.maxSize), int64(low), st.UsedSize, st.FreedSize, st.Removed})
	}
	if st.Removed == 0 {
		fmt.Fprintf(c.stdout, "%s used in %s, at most %s: nothing to evict\n", humanize.IBytes(uint64(st.UsedSize)), c.dir, humanize.IBytes(uint64(c.maxSize)))
		return nil
	}
	fmt.Fprintf(c.stdout, "%s used in %s: evicted %s least recently used blocks (%s), now %s\n",
		humanize.IBytes(uint64(st.UsedSize)), c.dir, humanize.Comma(st.Removed), humanize.IBytes(uint64(st.FreedSize)),
		humanize.IBytes(uint64(st.UsedSize-st.FreedSize)))
	return nil
}
