package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/dustin/go-humanize"
)

func cleanFlags(fs *flag.FlagSet, c *config) {
	fs.DurationVar(&c.olderThan, "older-than", defaultOlderThan, "remove temporary files last modified longer ago than this; must exceed the longest store")
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
