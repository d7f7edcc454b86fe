package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
)

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
		if (c.isSet("namespace") || c.vllm != nil) && u.Namespace != c.namespace {
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
