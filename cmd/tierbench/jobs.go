package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/uringtier/uringtier/tier"
)

// --jobs N runs the workloads in N processes of this same binary, each
// with its own tier on the one directory, as N tensor-parallel ranks or N
// servers sharing a filesystem would. A job's process is this command
// again with --job-index j and --json: it runs the workloads and writes
// JSON lines on stdout, which the parent reads:
//
//	{"type":"ready", ...}     before each workload, and before closing a tier: the job waits for a "go" line on stdin
//	{"type":"interval", ...}  an interval's figures (--interval, --plot)
//	{"type":"result", ...}    a workload's result, with its latency histogram
//	{"type":"note", ...}      a note for the end of the report
//
// The parent says "go" when every job still running is ready, so the jobs
// run each workload at the same time, and sums their results per engine
// and workload: counts and CPU time add up, the run lasts as long as the
// longest job (rates are totals over that), and the latency histograms
// merge. Stores write disjoint keys: job j writes keys base+j, base+j+N, …

// childEnv marks a job's process, for a test binary's TestMain.
const childEnv = "TIERBENCH_JOB"

// jobLine is a line from job j's stdout; eof after the last.
type jobLine struct {
	job  int
	line []byte
	eof  bool
}

// runJobs starts the jobs, relays what they say and sums their results.
func (s *session) runJobs(ctx context.Context, names []string) ([]*result, error) {
	c := s.c
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("--jobs: find this program: %w", err)
	}
	lines := make(chan jobLine)
	cmds := make([]*exec.Cmd, c.jobs)  // jobs still running (stdout open)
	procs := make([]*exec.Cmd, c.jobs) // every job, to wait for
	stdins := make([]io.WriteCloser, c.jobs)
	var relay sync.WaitGroup
	for j := range c.jobs {
		args := append([]string{c.command}, c.args...)
		args = append(args, "--dir", s.backing, "--json", "--job-index", strconv.Itoa(j))
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("--jobs: start job %d: %w", j, err)
		}
		cmds[j], procs[j], stdins[j] = cmd, cmd, stdin
		relay.Add(2)
		go func() {
			defer relay.Done()
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				lines <- jobLine{job: j, line: append([]byte(nil), sc.Bytes()...)}
			}
			lines <- jobLine{job: j, eof: true}
		}()
		go func() {
			defer relay.Done()
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				fmt.Fprintf(c.stderr, "tierbench: job %d: %s\n", j, sc.Text())
			}
		}()
	}

	perJob := make([][]*result, c.jobs)
	ready := make([]bool, c.jobs)
	running := c.jobs
	interrupted := ctx.Done()
	// release says "go" once every job still running is ready.
	release := func() {
		for j := range c.jobs {
			if cmds[j] != nil && !ready[j] {
				return
			}
		}
		for j := range c.jobs {
			if cmds[j] != nil {
				ready[j] = false
				io.WriteString(stdins[j], "go\n") // a job that died meanwhile is seen at its EOF
			}
		}
	}
	var protoErr error
	for running > 0 {
		var l jobLine
		select {
		case l = <-lines:
		case <-interrupted:
			interrupted = nil
			for _, cmd := range cmds {
				if cmd != nil {
					cmd.Process.Signal(os.Interrupt)
				}
			}
			continue
		}
		if l.eof {
			running--
			stdins[l.job].Close()
			cmds[l.job] = nil
			release()
			continue
		}
		var head struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(l.line, &head); err != nil {
			protoErr = fmt.Errorf("--jobs: job %d said %q: %w", l.job, l.line, err)
			continue
		}
		switch head.Type {
		case "ready":
			ready[l.job] = true
			release()
		case "interval":
			var smp intervalSample
			if err := json.Unmarshal(l.line, &smp); err == nil {
				s.interval(smp)
			}
		case "result":
			r := &result{}
			if err := json.Unmarshal(l.line, r); err != nil {
				protoErr = fmt.Errorf("--jobs: job %d: result: %w", l.job, err)
				continue
			}
			perJob[l.job] = append(perJob[l.job], r)
		case "note":
			s.note("%s", head.Text)
		}
	}
	relay.Wait()
	// Exit status 1 with results is keys that failed, which the results
	// say; anything else is a job that failed.
	var failed error
	for j, cmd := range procs {
		err := cmd.Wait()
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == exitFailure && len(perJob[j]) > 0) && failed == nil {
			failed = fmt.Errorf("--jobs: job %d: %w", j, err)
		}
	}
	if protoErr != nil {
		return nil, protoErr
	}
	if failed != nil && ctx.Err() == nil {
		return nil, failed
	}
	return s.sumJobs(perJob), nil
}

// barrier, in a job's process, tells the parent that the job is ready to
// run the workload and waits for its go-ahead; elsewhere it does nothing.
func (s *session) barrier(engine, workload string) error {
	if !s.child() {
		return nil
	}
	s.live.send(struct {
		Type     string `json:"type"`
		Engine   string `json:"engine"`
		Workload string `json:"workload"`
	}{"ready", engine, workload})
	if s.barrierIn == nil {
		s.barrierIn = bufio.NewReader(os.Stdin)
	}
	line, err := s.barrierIn.ReadString('\n')
	if err != nil || line != "go\n" {
		return fmt.Errorf("job %d: no go-ahead from the parent for %s %s (%q, %v)", s.c.jobIndex, engine, workload, line, err)
	}
	return nil
}

// sumJobs orders the jobs' results by engine and workload, each job's row
// followed by their sum, and grows the data set by the keys every job
// stored.
func (s *session) sumJobs(perJob [][]*result) []*result {
	type group struct{ engine, workload string }
	var order []group
	by := map[group][]*result{}
	storedMin := int64(-1)
	for _, rs := range perJob {
		stored := int64(0)
		for _, r := range rs {
			g := group{r.Engine, r.Workload}
			if _, ok := by[g]; !ok {
				order = append(order, g)
			}
			by[g] = append(by[g], r)
			if r.Workload == "store" {
				stored += r.Keys
			}
		}
		if storedMin < 0 || stored < storedMin {
			storedMin = stored
		}
	}
	// Keys base .. base + N × min(stored) - 1 were all written.
	s.m.Blocks = max(s.m.Blocks, s.storeBase+uint64(max(storedMin, 0))*uint64(s.c.jobs))
	var out []*result
	for _, g := range order {
		out = append(out, by[g]...)
		out = append(out, sumResults(by[g]))
	}
	return out
}

// sumResults is the row of several jobs' results of one engine and
// workload: counts add up, the time is the longest job's, the histograms
// merge; Stopped says how many jobs stopped early, and the first one's why.
func sumResults(rs []*result) *result {
	t := addResults(rs, false)
	t.Job, t.Jobs = -1, len(rs)
	return t
}

// addSlices is the row of one job's slices of a workload run one after
// the other (--interleave): what sumResults adds up, and the times too.
func addSlices(rs []*result) *result { return addResults(rs, true) }

// addResults adds up rs, of one engine and workload, run at once or, if
// sequential, one after the other.
func addResults(rs []*result, sequential bool) *result {
	f := rs[0]
	t := &result{
		Engine: f.Engine, Workload: f.Workload, Batch: f.Batch, Depth: f.Depth, BlockSize: f.BlockSize,
		Direct: f.Direct, Dir: f.Dir, Cold: f.Cold, Dist: f.Dist, EngineLine: f.EngineLine, Job: f.Job,
	}
	stopped, why := 0, "" // jobs whose store stopped early (Stopped), the first one's reason
	for _, r := range rs {
		t.Keys += r.Keys
		t.Batches += r.Batches
		t.Found += r.Found
		t.Missing += r.Missing
		t.Errors += r.Errors
		t.Full += r.Full
		t.Evicted += r.Evicted
		t.EvictedBytes += r.EvictedBytes
		t.Evictor = t.Evictor || r.Evictor
		t.Busy += r.Busy
		t.Shared += r.Shared
		t.KernelSleeps += r.KernelSleeps
		if workloadOps[r.Workload] != tier.OpLookup {
			t.bytes += r.Found * int64(r.BlockSize)
		}
		if sequential {
			t.elapsed += seconds(r.Seconds)
		} else {
			t.elapsed = max(t.elapsed, seconds(r.Seconds))
		}
		t.cpu += seconds(r.CPUSeconds)
		t.latencyMax = max(t.latencyMax, micros(r.LatencyUS.Max))
		t.submitMax = max(t.submitMax, micros(r.SubmitMaxUS))
		t.pollMax = max(t.pollMax, micros(r.PollMaxUS))
		t.callerMax = max(t.callerMax, micros(r.CallerMaxUS))
		if r.LatencyHist != nil {
			t.hist.Add(r.LatencyHist)
		}
		if r.OpLatencyHist != nil {
			t.opHist.Add(r.OpLatencyHist)
		}
		if r.CallerHist != nil {
			t.callerHist.Add(r.CallerHist)
		}
		if t.FirstError == "" {
			t.FirstError = r.FirstError
		}
		if r.Stopped != "" {
			if stopped++; stopped == 1 {
				why = fmt.Sprintf("job %d: %s", r.Job, r.Stopped)
			}
		}
	}
	if stopped > 0 && !sequential {
		t.Stopped = fmt.Sprintf("%d of %d jobs; %s", stopped, len(rs), why)
	}
	t.finish()
	return t
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func micros(us float64) time.Duration { return time.Duration(us * float64(time.Microsecond)) }
