package main

import (
	"context"
	"fmt"
	"os"
)

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
	all, err := s.runEngines(ctx, []string{"lookup", "load", "store"})
	if err != nil {
		return err
	}
	return s.interrupted(ctx, s.report(all))
}
