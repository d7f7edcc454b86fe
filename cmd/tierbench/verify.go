package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/blockstore"
)

func verifyFlags(fs *flag.FlagSet, c *config) {
	fs.BoolVar(&c.repair, "repair", false, "remove corrupt blocks (a cache can lose them; the next store rewrites them)")
	fs.Var(&c.blockSize, "block-size", "raw blocks: the size every block file must have (default: the data set's, as populate recorded it)")
}

// cmdVerify checksums every block; with --repair it removes the corrupt ones.
func cmdVerify(_ context.Context, c *config) error {
	s, err := openStore(c)
	if err != nil {
		return err
	}
	if format, _ := c.blockFormat(); format == blockstore.FormatRaw && !c.isSet("block-size") {
		if _, err := readManifest(c.dir, c.dataSet()); c.namespace == "" || err != nil {
			return usagef("--block-size is needed to verify raw blocks (no data set of populate says it)")
		}
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

// nsText names the namespaces a command covers.
func nsText(ns string) string {
	if ns == "" {
		return "every namespace"
	}
	return "namespace " + ns
}
