package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/tier"
)

// printHeader says what the run is about to measure.
func printHeader(w io.Writer, s *session, pop *result) {
	c := s.c
	fmt.Fprintf(w, "data set: %s blocks of %s (%s) in %s, namespace %s; populated in %.1fs (%s/s, %s engine)\n",
		humanize.Comma(int64(c.blocks)), humanize.IBytes(uint64(s.m.BlockSize)), humanize.IBytes(uint64(c.blocks)*uint64(s.m.BlockSize)),
		s.backing, c.namespace, pop.Seconds, humanize.Bytes(uint64(pop.BytesPerSec)), pop.Engine)
	batches := fmt.Sprintf("lookups %d keys per batch, loads and stores %d", s.batchFor(tier.OpLookup), s.batchFor(tier.OpLoad))
	if c.batch > 0 {
		batches = fmt.Sprintf("%d keys per batch", c.batch)
	}
	fmt.Fprintf(w, "workloads: %s, %d batches in flight, hit ratio %.2f, %s\n\n", s.limitText(), c.depth, c.hitRatio, batches)
}

// report prints the results (a table, or JSON lines) and the notes, and
// turns failed keys into exit status 1.
func (s *session) report(rs []*result) error {
	c := s.c
	if c.json {
		enc := json.NewEncoder(c.stdout)
		for _, r := range rs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		for _, n := range s.notes {
			fmt.Fprintf(c.stderr, "tierbench: %s\n", n)
		}
	} else {
		printTable(c.stdout, rs)
		fmt.Fprintln(c.stdout)
		seen := map[string]bool{}
		for _, r := range rs {
			if !seen[r.Engine] {
				seen[r.Engine] = true
				fmt.Fprintln(c.stdout, engineLine(r.engineInfo))
			}
		}
		for _, n := range s.notes {
			fmt.Fprintln(c.stdout, n)
		}
	}
	failed := false
	for _, r := range rs {
		if r.Errors > 0 {
			failed = true
			fmt.Fprintf(c.stderr, "tierbench: %s %s: %d keys failed; first: %s\n", r.Engine, r.Workload, r.Errors, r.FirstError)
		}
	}
	if failed {
		return errReported
	}
	return nil
}

// printTable prints one row per engine × workload.
func printTable(w io.Writer, rs []*result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "engine  \tworkload\tbatch\tkeys\tkeys/s\tbytes/s\thit\tp50\tp99\tp99.9\tmax\tcaller max\terrors\t")
	for _, r := range rs {
		rate := "-"
		if r.Workload != "lookup" {
			rate = humanize.Bytes(uint64(r.BytesPerSec)) + "/s"
		}
		hit := "-"
		if r.Keys > 0 && r.Workload != "store" && r.Workload != "populate" {
			hit = fmt.Sprintf("%.0f%%", 100*float64(r.Found)/float64(r.Keys))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n",
			fmt.Sprintf("%-8s", r.Engine), fmt.Sprintf("%-8s", r.Workload), r.Batch, humanize.Comma(r.Keys), humanize.Comma(int64(r.KeysPerSec)), rate, hit,
			dur(r.LatencyUS.P50), dur(r.LatencyUS.P99), dur(r.LatencyUS.P999), dur(r.LatencyUS.Max), dur(r.CallerMaxUS), r.Errors)
	}
	tw.Flush()
}

// dur prints microseconds with three significant digits and a unit.
func dur(us float64) string {
	d := time.Duration(us * 1e3)
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", us)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", us/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.1fms", us/1e3)
	default:
		return fmt.Sprintf("%.2fs", us/1e6)
	}
}

// engineLine states the engine and the kernel features in use.
func engineLine(e tier.EngineInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", e.Kind)
	if e.Kind == tier.EngineURing {
		rings := "rings"
		if e.Rings == 1 {
			rings = "ring"
		}
		fmt.Fprintf(&b, "io_uring, %d %s, setup flags %s; ", e.Rings, rings, e.Flags)
	} else {
		b.WriteString("plain syscalls on a pool of goroutines; ")
	}
	if e.Direct {
		b.WriteString("loads with O_DIRECT")
	} else {
		fmt.Fprintf(&b, "loads through the page cache (%s)", e.NoDirect)
	}
	if e.Fallback != "" {
		fmt.Fprintf(&b, "; auto fell back to sync: %s", e.Fallback)
	}
	return b.String()
}

// progress draws a bar on a terminal; elsewhere it does nothing.
type progress struct {
	w     io.Writer // nil: disabled
	total int64
	label string
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, total int64, label string, enabled bool) *progress {
	p := &progress{total: total, label: label, start: time.Now()}
	if enabled && isTerminal(w) {
		p.w = w
	}
	return p
}

func (p *progress) update(done int64) {
	if p.w == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.last) < 100*time.Millisecond && done < p.total {
		return
	}
	p.last = now
	const width = 30
	fill := int(int64(width) * done / max(p.total, 1))
	fmt.Fprintf(p.w, "\r%s [%s%s] %3d%% %s/%s", p.label, strings.Repeat("#", fill), strings.Repeat(".", width-fill),
		100*done/max(p.total, 1), humanize.Comma(done), humanize.Comma(p.total))
}

func (p *progress) finish() {
	if p.w != nil {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// isTerminal reports whether w is a terminal (TCGETS succeeds on it).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// syncFS writes dirty data back before caches are dropped.
func syncFS() { unix.Sync() }
