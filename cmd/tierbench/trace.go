package main

import (
	"fmt"
	"os"
	"runtime/trace"
)

// startTrace starts a Go execution trace of one measured stretch (--trace):
// into --trace's path with the stretch's name, the engine and its number in
// this process appended (and, in a job's process, the job's index), so that
// rounds and engines do not overwrite each other. Submit and Poll calls are
// its regions "submit" and "poll" (bench.go): `go tool trace` shows what the
// Go scheduler did while a long one ran. It returns what ends the trace.
func (s *session) startTrace(name, engine string) (stop func() error, err error) {
	if s.c.trace == "" {
		return func() error { return nil }, nil
	}
	s.traces++
	path := fmt.Sprintf("%s.%s.%s.%d", s.c.trace, name, engine, s.traces)
	if s.child() {
		path += fmt.Sprintf(".job%d", s.c.jobIndex)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--trace: %w", err)
	}
	return func() error {
		trace.Stop()
		if err := f.Close(); err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
		s.note("trace of %s (%s) written to %s", name, engine, path)
		return nil
	}, nil
}
