package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/blockstore"
)

// openStore opens the block store at --dir, which must exist: maintenance
// never creates a directory.
func openStore(c *config) (*blockstore.Store, error) {
	fi, err := os.Stat(c.dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", c.dir)
	}
	return blockstore.Open(c.dir, blockstore.Options{})
}

func printJSON(c *config, v any) error {
	return json.NewEncoder(c.stdout).Encode(v)
}

// nsText names the namespaces a command covers.
func nsText(ns string) string {
	if ns == "" {
		return "every namespace"
	}
	return "namespace " + ns
}

// cmdVerify checksums every block; with --repair it removes the corrupt ones.
func cmdVerify(_ context.Context, c *config) error {
	s, err := openStore(c)
	if err != nil {
		return err
	}
	action := blockstore.VerifyReport
	if c.repair {
		action = blockstore.VerifyRemove
	}
	var removed, remaining int64
	report := func(p blockstore.Problem) {
		what := "corrupt"
		switch {
		case p.Removed:
			what = "removed"
			removed++
		case p.ActionErr != nil:
			what = fmt.Sprintf("corrupt, not removed (%v)", p.ActionErr)
			remaining++
		default:
			remaining++
		}
		w := c.stdout
		if c.json {
			w = c.stderr
		}
		fmt.Fprintf(w, "%s: %s: %v\n", what, p.Block.Path, p.Err)
	}
	st, err := s.Verify(c.namespace, action, report)
	if err != nil {
		return err
	}
	if c.json {
		err = printJSON(c, struct {
			Command   string `json:"command"`
			Namespace string `json:"namespace"`
			Blocks    int64  `json:"blocks"`
			Bytes     int64  `json:"bytes"`
			Corrupt   int64  `json:"corrupt"`
			Removed   int64  `json:"removed"`
			Remaining int64  `json:"remaining"`
		}{"verify", c.namespace, st.Blocks, st.Bytes, st.Corrupt, removed, remaining})
	} else {
		fmt.Fprintf(c.stdout, "verified %s blocks (%s) in %s of %s: %d corrupt, %d removed, %d remain\n",
			humanize.Comma(st.Blocks), humanize.IBytes(uint64(st.Bytes)), nsText(c.namespace), c.dir, st.Corrupt, removed, remaining)
		if remaining > 0 && !c.repair {
			fmt.Fprintln(c.stdout, "run with --repair to remove them (the next store rewrites a removed block)")
		}
	}
	if err != nil {
		return err
	}
	if remaining > 0 {
		return errReported
	}
	return nil
}

// cmdClean removes temporary files of dead writers.
func cmdClean(_ context.Context, c *config) error {
	s, err := openStore(c)
	if err != nil {
		return err
	}
	st, err := s.Clean(c.olderThan)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(c, struct {
			Command   string  `json:"command"`
			OlderThan float64 `json:"older_than_seconds"`
			Removed   int64   `json:"removed"`
			Bytes     int64   `json:"bytes"`
		}{"clean", c.olderThan.Seconds(), st.Removed, st.Bytes})
	}
	fmt.Fprintf(c.stdout, "removed %d temporary files (%s) older than %v from %s\n", st.Removed, humanize.IBytes(uint64(st.Bytes)), c.olderThan, c.dir)
	return nil
}

// cmdDu prints the blocks and bytes of every namespace (or of --namespace
// when given).
func cmdDu(_ context.Context, c *config) error {
	s, err := openStore(c)
	if err != nil {
		return err
	}
	usage, err := s.Usage()
	if err != nil {
		return err
	}
	type nsUsage struct {
		Namespace string `json:"namespace"`
		Blocks    int64  `json:"blocks"`
		Bytes     int64  `json:"bytes"`
	}
	out := struct {
		Command    string    `json:"command"`
		Blocks     int64     `json:"blocks"`
		Bytes      int64     `json:"bytes"`
		Namespaces []nsUsage `json:"namespaces"`
	}{Command: "du", Namespaces: []nsUsage{}}
	for _, u := range usage {
		if c.isSet("namespace") && u.Namespace != c.namespace {
			continue
		}
		out.Namespaces = append(out.Namespaces, nsUsage(u))
		out.Blocks += u.Blocks
		out.Bytes += u.Bytes
	}
	if c.json {
		return printJSON(c, out)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "namespace\tblocks\tbytes\t")
	for _, u := range out.Namespaces {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", u.Namespace, humanize.Comma(u.Blocks), humanize.IBytes(uint64(u.Bytes)))
	}
	fmt.Fprintf(tw, "total\t%s\t%s\t\n", humanize.Comma(out.Blocks), humanize.IBytes(uint64(out.Bytes)))
	return tw.Flush()
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
