package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/uringtier/uringtier/tier"
)

// printHeader says what the run is about to measure.
func printHeader(w io.Writer, s *session, pop *result) {
	c := s.c
	fmt.Fprintf(w, "data set: %s blocks of %s (%s) in %s, namespace %s; populated in %.1fs (%s/s, %s engine)\n",
		humanize.Comma(int64(c.blocks)), humanize.IBytes(uint64(s.m.BlockSize)), humanize.IBytes(uint64(c.blocks)*uint64(s.m.BlockSize)),
		s.backing, c.namespace, pop.Seconds, humanize.Bytes(uint64(pop.BytesPerSec)), pop.Engine)
	var batches, depths []string
	for _, name := range c.workloadNames() {
		batches = append(batches, fmt.Sprintf("%s %d", name, s.batchFor(name)))
		depths = append(depths, fmt.Sprintf("%s %d", name, s.depthFor(name)))
	}
	fmt.Fprintf(w, "workloads: %s, hit ratio %.2f, keys %s; keys per batch: %s; batches in flight: %s%s\n\n", s.limitText(), c.hitRatio, s.dist(),
		strings.Join(batches, ", "), strings.Join(depths, ", "), s.jobsText())
}

// report prints the results (a table, or JSON lines) and the notes, and
// turns failed keys into exit status 1. A job's process has sent its
// results to the parent already, which reports them.
func (s *session) report(rs []*result) error {
	c := s.c
	failed := false
	for _, r := range rs {
		failed = failed || r.Errors > 0
	}
	if s.child() {
		for _, n := range s.notes {
			s.live.send(struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}{"note", n})
		}
		if failed {
			return errReported
		}
		return nil
	}
	engines := engineRatios(rs)
	if c.json {
		enc := json.NewEncoder(c.stdout)
		for _, r := range rs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		if c.rounds > 1 { // the default run's lines stay results alone
			for _, r := range engines {
				if err := enc.Encode(r); err != nil {
					return err
				}
			}
		}
		for _, r := range s.ratios {
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
		fmt.Fprint(c.stdout, ratioLines(engines))
		for _, r := range s.ratios {
			fmt.Fprintln(c.stdout, r.text)
		}
		for _, r := range rs {
			if line := evictionLine(r, c.jobs > 1); line != "" {
				fmt.Fprintln(c.stdout, line)
			}
			if line := stoppedLine(r); line != "" {
				fmt.Fprintln(c.stdout, line)
			}
		}
		seen := map[string]bool{}
		for _, r := range rs {
			if !seen[r.EngineLine] && r.EngineLine != "" {
				seen[r.EngineLine] = true
				fmt.Fprintln(c.stdout, r.EngineLine)
			}
		}
		for _, n := range s.notes {
			fmt.Fprintln(c.stdout, n)
		}
	}
	if c.plot != "" {
		if err := writePlot(c.plot, s.intervals, rs); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		fmt.Fprintf(c.stderr, "tierbench: plot written to %s\n", c.plot)
	}
	for _, r := range rs {
		if r.Errors > 0 && (c.jobs <= 1 || r.Job >= 0) {
			fmt.Fprintf(c.stderr, "tierbench: %s %s: %d keys failed; first: %s\n", r.Engine, r.Workload, r.Errors, r.FirstError)
		}
	}
	if failed {
		return errReported
	}
	return nil
}

// printTable prints one row per engine × workload (× job, with --jobs;
// × phase, for mixed; × round, with --rounds).
func printTable(w io.Writer, rs []*result) {
	jobs, phases, full, rounds := false, false, false, false
	for _, r := range rs {
		jobs = jobs || r.Jobs > 1 || r.Job > 0
		phases = phases || r.Phase != ""
		full = full || r.Full > 0
		rounds = rounds || r.Round > 1
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	job := ""
	if jobs {
		job = "job\t"
	}
	if phases {
		job = "phase   \t" + job
	}
	if rounds {
		job = "round\t" + job
	}
	fullHead := ""
	if full {
		fullHead = "full\t"
	}
	fmt.Fprintln(tw, "engine  \tworkload\t"+job+"batch\tkeys\tkeys/s\tbytes/s\thit\tp50\tp99\tp99.9\tmax\tcaller p99.9\tcaller max\tcpu/key\t"+fullHead+"errors\t")
	for _, r := range rs {
		rate := "-"
		if workloadOps[r.Workload] != tier.OpLookup {
			rate = humanize.Bytes(uint64(r.BytesPerSec)) + "/s"
		}
		hit := "-"
		if r.Keys > 0 && r.Workload != "store" && r.Workload != "populate" {
			hit = fmt.Sprintf("%.0f%%", 100*float64(r.Found)/float64(r.Keys))
		}
		job := ""
		if jobs {
			job = strconv.Itoa(r.Job) + "\t"
			if r.Job < 0 {
				job = "all\t"
			}
		}
		if phases {
			job = fmt.Sprintf("%-8s\t", r.Phase) + job
		}
		if rounds {
			job = strconv.Itoa(r.Round) + "\t" + job
		}
		fullCol := ""
		if full {
			fullCol = humanize.Comma(r.Full) + "\t"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s%d\t\n",
			fmt.Sprintf("%-8s", r.Engine), fmt.Sprintf("%-8s", r.Workload), job, r.Batch, humanize.Comma(r.Keys), humanize.Comma(int64(r.KeysPerSec)), rate, hit,
			dur(r.LatencyUS.P50), dur(r.LatencyUS.P99), dur(r.LatencyUS.P999), dur(r.LatencyUS.Max), dur(r.CallerUS.P999), dur(r.CallerMaxUS), dur(r.CPUUSPerKey), fullCol, r.Errors)
	}
	tw.Flush()
}

// evictionLine says what the tier's evictor removed during r's workload,
// and whether this job's tier was the evictor; "" when it removed nothing.
// With jobs, only the jobs' rows say so, not their sum.
func evictionLine(r *result, jobs bool) string {
	if r.Evicted == 0 || jobs && r.Job < 0 {
		return ""
	}
	who := "this tier held the lease"
	if jobs {
		who = fmt.Sprintf("job %d held the lease", r.Job)
	}
	if !r.Evictor {
		who = "the lease was lost meanwhile"
	}
	phase := ""
	if r.Phase != "" {
		phase = " " + r.Phase
	}
	return fmt.Sprintf("%s %s%s: evicted %s blocks (%s) to stay within the capacity; %s",
		r.Engine, r.Workload, phase, humanize.Comma(int64(r.Evicted)), humanize.IBytes(r.EvictedBytes), who)
}

// stoppedLine says, under the table, why a row's workload stopped early
// (result.Stopped), or returns "".
func stoppedLine(r *result) string {
	if r.Stopped == "" {
		return ""
	}
	who := r.Engine + " " + r.Workload
	if r.Round > 1 {
		who += fmt.Sprintf(" round %d", r.Round)
	}
	if r.Job >= 0 && r.Jobs > 1 {
		who += fmt.Sprintf(" job %d", r.Job)
	}
	return fmt.Sprintf("%s stopped early, its row counting %s keys: %s", who, humanize.Comma(r.Keys), r.Stopped)
}

// dur prints microseconds with three significant digits and a unit.
func dur(us float64) string {
	d := time.Duration(us * 1e3)
	switch {
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.2fµs", us)
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
		switch {
		case e.LoadsSync && e.StoresSync:
			b.WriteString("loads and stores as plain syscalls on a pool of goroutines (tmpfs); ")
		case e.LoadsSync:
			b.WriteString("loads as plain syscalls on a pool of goroutines (tmpfs); ")
		case e.StoresSync && e.Direct: // on tmpfs (LoadsSync) the writes stay on the pool
			b.WriteString("stores as plain syscalls on a pool of goroutines, their writes on the rings when many are in flight (a local filesystem); ")
		case e.StoresSync:
			b.WriteString("stores as plain syscalls on a pool of goroutines (a local filesystem); ")
		}
	} else {
		b.WriteString("plain syscalls on a pool of goroutines; ")
	}
	if e.Direct {
		b.WriteString("loads and stores with O_DIRECT")
		if e.LastPageApart {
			b.WriteString(", a load's last page read apart (the filesystem miscounts asynchronous O_DIRECT reads at a file's end)")
		}
	} else {
		fmt.Fprintf(&b, "loads and stores through the page cache (%s)", e.NoDirect)
	}
	if e.Fallback != "" {
		fmt.Fprintf(&b, "; auto fell back to sync: %s", e.Fallback)
	}
	return b.String()
}

// liveOutput writes what a run says while it runs: --interval lines, and
// in a job's process every object the parent reads.
type liveOutput struct {
	s   *session
	enc *json.Encoder
}

// send writes v as one JSON line to stdout.
func (l *liveOutput) send(v any) {
	if l.enc == nil {
		l.enc = json.NewEncoder(l.s.c.stdout)
	}
	l.enc.Encode(v)
}

// interval keeps an interval's figures for the plot and prints them if
// --interval asks: a line, or with --json (and in a job's process) an
// object.
func (s *session) interval(smp intervalSample) {
	s.intervals = append(s.intervals, smp)
	switch {
	case s.child():
		s.live.send(smp)
	case s.c.interval == 0:
	case s.c.json:
		s.live.send(smp)
	default:
		fmt.Fprintln(s.c.stdout, intervalLine(smp, s.c.jobs > 1))
	}
}

// intervalLine is an interval's figures for people.
func intervalLine(smp intervalSample, jobs bool) string {
	job := ""
	if jobs {
		job = fmt.Sprintf("job %d ", smp.Job)
	}
	if smp.Phase != "" {
		job += smp.Phase + " "
	}
	rate := "-"
	if workloadOps[smp.Workload] != tier.OpLookup {
		rate = humanize.Bytes(uint64(smp.BytesPerSec)) + "/s"
	}
	return fmt.Sprintf("[%6.1fs] %s%-5s %-8s %12s keys/s %12s  p50 %-8s p99 %-8s in flight %s ops, %d batches",
		smp.T, job, smp.Engine, smp.Workload, humanize.Comma(int64(smp.KeysPerSec)), rate, dur(smp.P50US), dur(smp.P99US),
		humanize.Comma(int64(smp.InFlight)), smp.Batches)
}

// emit sends a finished result to the parent, in a job's process.
func (s *session) emit(r *result) {
	if s.child() {
		s.live.send(r)
	}
}

// progress draws a bar (schollz/progressbar) on a terminal; elsewhere it
// does nothing.
type progress struct {
	bar *progressbar.ProgressBar // nil: disabled
}

func newProgress(w io.Writer, total int64, label string, enabled bool) *progress {
	if !enabled || !isTerminal(w) {
		return &progress{}
	}
	return &progress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(label),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("blocks"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetPredictTime(true),
	)}
}

func (p *progress) update(done int64) {
	if p.bar != nil {
		p.bar.Set64(done)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// syncFS writes dirty data back before caches are dropped.
func syncFS() { unix.Sync() }
