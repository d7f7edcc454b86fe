package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
)

// cmdDu prints the blocks and bytes of every namespace (or of --namespace
// when given), each counted by one scan of a blockstore.Index. A scan that
// takes longer than a second reports its progress on stderr.
func cmdDu(_ context.Context, c *config) error {
	s, err := openStore(c)
	if err != nil {
		return err
	}
	var names []string
	if c.isSet("namespace") || c.vllm != nil {
		names = []string{c.namespace}
	} else if names, err = s.Namespaces(); err != nil {
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
	for _, ns := range names {
		idx, err := s.NewIndex(ns)
		if err != nil {
			return err
		}
		start, last := time.Now(), time.Now()
		err = idx.Scan(func(blocks, _ int64) {
			if now := time.Now(); !c.json && now.Sub(start) > time.Second && now.Sub(last) >= time.Second {
				last = now
				fmt.Fprintf(c.stderr, "tierbench du: %s: scanned %s blocks\n", ns, humanize.Comma(blocks))
			}
		})
		if err != nil {
			return err
		}
		blocks, bytes := idx.Usage()
		if blocks == 0 {
			continue // as a namespace without blocks always was: not listed
		}
		out.Namespaces = append(out.Namespaces, nsUsage{ns, blocks, bytes})
		out.Blocks += blocks
		out.Bytes += bytes
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
