package main

import (
	"context"
	"fmt"
	"os"
)

// cmdRun is the default: populate, then every workload with every engine.
func cmdRun(ctx context.Context, c *config) (err error) {
	s := newSession(c, c.dir)
	if s.child() {
		// One of --jobs: the parent has populated --dir.
		m, err := readManifest(c.dir, c.dataSet())
		if err != nil {
			return err
		}
		s.root = c.dir
		s.setManifest(m)
		all, err := s.runWorkloads(ctx, c.workloadNames())
		if err != nil {
			return err
		}
		return s.interrupted(ctx, s.report(all))
	}
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
	all, err := s.runWorkloads(ctx, c.workloadNames())
	if err != nil {
		return err
	}
	return s.interrupted(ctx, s.report(all))
}
