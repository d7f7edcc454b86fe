package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// scrape fetches url and parses the Prometheus text format.
func scrape(t *testing.T, url string) (map[string]*dto.MetricFamily, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	return mfs, body
}

func counterValue(mf *dto.MetricFamily, label, value string) float64 {
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label && lp.GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// TestMetricsEndpoint scrapes --metrics-addr while a tiny lookup run goes
// on: the tier's metrics are there with their types, promlint finds no
// problem, and the key counter moves between two scrapes.
func TestMetricsEndpoint(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "40", "--block-size", "4KiB")
	stderr := &syncBuffer{}
	var stdout bytes.Buffer
	done := make(chan int)
	go func() {
		done <- run([]string{"lookup", "--dir", dir, "--duration", "3s", "--batch", "8", "--depth", "2",
			"--metrics-addr", "127.0.0.1:0"}, &stdout, stderr)
	}()
	addr := regexp.MustCompile(`metrics at (http://\S+/metrics)`)
	var url string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(stderr.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 10*time.Second, 5*time.Millisecond, "no metrics address: %s", stderr)

	var first float64
	var mfs map[string]*dto.MetricFamily
	var body []byte
	require.Eventually(t, func() bool {
		mfs, body = scrape(t, url)
		mf := mfs["uringtier_keys_total"]
		if mf == nil {
			return false
		}
		first = counterValue(mf, "op", "lookup")
		return first > 0
	}, 10*time.Second, 20*time.Millisecond, "the key counter never moved")
	types := map[string]dto.MetricType{
		"uringtier_keys_total":                 dto.MetricType_COUNTER,
		"uringtier_requests_total":             dto.MetricType_COUNTER,
		"uringtier_key_outcomes_total":         dto.MetricType_COUNTER,
		"uringtier_read_bytes_total":           dto.MetricType_COUNTER,
		"uringtier_breaker_trips_total":        dto.MetricType_COUNTER,
		"uringtier_operations_in_flight":       dto.MetricType_GAUGE,
		"uringtier_breaker_open":               dto.MetricType_GAUGE,
		"uringtier_engine_info":                dto.MetricType_GAUGE,
		"uringtier_request_duration_seconds":   dto.MetricType_HISTOGRAM,
		"uringtier_operation_duration_seconds": dto.MetricType_HISTOGRAM,
		"uringtier_queue_wait_seconds":         dto.MetricType_HISTOGRAM,
		"go_goroutines":                        dto.MetricType_GAUGE,
		"process_cpu_seconds_total":            dto.MetricType_COUNTER,
	}
	for name, typ := range types {
		require.Contains(t, mfs, name)
		assert.Equal(t, typ, mfs[name].GetType(), name)
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	require.NoError(t, err)
	var ours []promlint.Problem
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "uringtier_") {
			ours = append(ours, p)
		}
	}
	assert.Empty(t, ours, "promlint")
	require.Eventually(t, func() bool {
		mfs, _ := scrape(t, url)
		return counterValue(mfs["uringtier_keys_total"], "op", "lookup") > first
	}, 10*time.Second, 20*time.Millisecond, "the key counter stopped at %v", first)
	require.Equal(t, exitOK, <-done, "stdout:\n%s\nstderr:\n%s", &stdout, stderr)
	_, err = http.Get(url)
	assert.Error(t, err, "the metrics server outlived the run")
}

// jsonObjects splits JSON lines into results and intervals.
func jsonObjects(t *testing.T, out string) (results []map[string]any, intervals []map[string]any) {
	t.Helper()
	for _, line := range jsonLines(t, out) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		switch m["type"] {
		case "result":
			results = append(results, m)
		case "interval":
			intervals = append(intervals, m)
		default:
			t.Fatalf("unexpected line %s", line)
		}
	}
	return results, intervals
}

// TestJobs runs 4 jobs on one directory: per engine and workload, 4 rows
// and a row whose counts are their sums, whose time is the longest job's
// and whose rate is over that time; interval objects come from every job;
// stores of the jobs write different keys, all of which the data set
// counts afterwards.
func TestJobs(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	pic := filepath.Join(t.TempDir(), "jobs.png")
	out := mustRun(t, "run", "--json", "--jobs", "4", "--blocks", "40", "--block-size", "8KiB", "--duration", "300ms",
		"--interval", "50ms", "--batch", "8", "--depth", "3", "--engine", "sync", "--plot", pic)
	checkPNG(t, pic)
	results, intervals := jsonObjects(t, out)
	require.Len(t, results, 3*5, "lookup, load, store × (4 jobs + all)")
	for i := 0; i < len(results); i += 5 {
		total := results[i+4]
		require.Equal(t, -1.0, total["job"])
		require.Equal(t, 4.0, total["jobs"])
		sums := map[string]float64{}
		longest := 0.0
		for j := range 4 {
			r := results[i+j]
			require.Equal(t, float64(j), r["job"])
			require.Equal(t, total["workload"], r["workload"])
			for _, f := range []string{"keys", "batches", "found", "missing", "errors", "cpu_seconds"} {
				sums[f] += r[f].(float64)
			}
			longest = math.Max(longest, r["seconds"].(float64))
			assert.Positive(t, r["cpu_us_per_key"], "job %d %s", j, r["workload"])
		}
		for f, v := range sums {
			assert.InDelta(t, v, total[f].(float64), 1e-6*math.Max(v, 1), "%s %s", total["workload"], f)
		}
		assert.Positive(t, total["keys"])
		assert.InDelta(t, longest, total["seconds"].(float64), 1e-6)
		assert.InEpsilon(t, total["keys"].(float64)/total["seconds"].(float64), total["keys_per_sec"], 1e-6)
	}
	jobs := map[float64]bool{}
	for _, iv := range intervals {
		jobs[iv["job"].(float64)] = true
		assert.Contains(t, []any{"lookup", "load", "store"}, iv["workload"])
	}
	assert.Len(t, jobs, 4, "interval objects from every job")

	// Stores: 4 jobs of 24 keys each, all different.
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "10", "--block-size", "4KiB")
	out = mustRun(t, "store", "--dir", dir, "--jobs", "4", "--keys", "24", "--batch", "8", "--engine", "sync", "--interval", "10ms")
	assert.Regexp(t, `(?m)^\s*sync\s+store\s+all\s+8\s+96\s`, out)
	assert.Regexp(t, `(?m)^\[\s*\d+\.\ds\] job \d sync\s+store`, out, "no interval lines")
	assert.Equal(t, uint64(10+96), readManifestT(t, dir).Blocks)
	assert.Contains(t, mustRun(t, "verify", "--dir", dir), "verified 106 blocks")
}

// TestIntervalLines checks the live lines of one process, in text and JSON.
func TestIntervalLines(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "40", "--block-size", "4KiB")
	out := mustRun(t, "lookup", "--dir", dir, "--duration", "300ms", "--interval", "50ms", "--batch", "8", "--engine", "sync")
	lines := regexp.MustCompile(`(?m)^\[\s*\d+\.\ds\] sync\s+lookup\s+[\d,]+ keys/s\s+-\s+p50 \S+\s+p99 \S+\s+in flight [\d,]+ ops, \d+ batches$`).FindAllString(out, -1)
	assert.GreaterOrEqual(t, len(lines), 3, out)
	out = mustRun(t, "load", "--dir", dir, "--duration", "300ms", "--interval", "50ms", "--batch", "8", "--engine", "sync", "--json")
	results, intervals := jsonObjects(t, out)
	require.Len(t, results, 1)
	require.GreaterOrEqual(t, len(intervals), 3)
	keys := 0.0
	for _, iv := range intervals {
		for _, f := range []string{"t", "seconds", "keys", "keys_per_sec", "bytes_per_sec", "p50_us", "p99_us", "in_flight", "batches_in_flight"} {
			require.Contains(t, iv, f)
		}
		assert.Positive(t, iv["bytes_per_sec"])
		keys += iv["keys"].(float64)
	}
	assert.LessOrEqual(t, keys, results[0]["keys"].(float64), "the intervals count more keys than the run")
	assert.GreaterOrEqual(t, keys, 0.8*results[0]["keys"].(float64), "the intervals miss keys")
}

// TestPlotAndReport draws a run's picture directly (--plot) and from its
// JSON lines (report), as PNG and SVG.
func TestPlotAndReport(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "40", "--block-size", "4KiB")
	pic := filepath.Join(t.TempDir(), "run.png")
	mustRun(t, "lookup", "--dir", dir, "--duration", "200ms", "--batch", "8", "--engine", "all", "--plot", pic)
	checkPNG(t, pic)

	out := mustRun(t, "load", "--dir", dir, "--duration", "200ms", "--interval", "20ms", "--batch", "8", "--engine", "all", "--json")
	jsonl := filepath.Join(t.TempDir(), "load.jsonl")
	require.NoError(t, os.WriteFile(jsonl, []byte(out), 0o644))
	rep := mustRun(t, "report", jsonl)
	assert.Contains(t, rep, "plot written to "+strings.TrimSuffix(jsonl, ".jsonl")+".png")
	assert.Regexp(t, `(?m)^\s*\w+\s+load\s+8\s`, rep)
	checkPNG(t, strings.TrimSuffix(jsonl, ".jsonl")+".png")
	svg := filepath.Join(t.TempDir(), "load.svg")
	mustRun(t, "report", jsonl, "--plot", svg)
	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.Contains(t, string(b), "<svg")
	assert.Contains(t, string(b), "Throughput over time")

	code, _, stderr := tierbench(t, "report", filepath.Join(dir, "nonexistent.jsonl"))
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "no such file")
}

// TestTrace: --trace writes a Go execution trace of each measured stretch,
// one file per workload, engine and stretch, with the calls as regions.
func TestTrace(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "40", "--block-size", "4KiB")
	base := filepath.Join(t.TempDir(), "tb")
	out := mustRun(t, "lookup", "--dir", dir, "--duration", "100ms", "--warmup", "0", "--batch", "8", "--engine", "all", "--rounds", "2", "--trace", base)
	files, err := filepath.Glob(base + ".*")
	require.NoError(t, err)
	require.NotEmpty(t, files, "no trace written")
	want := []string{base + ".lookup.sync.2", base + ".lookup.sync.3", base + ".lookup.uring.1", base + ".lookup.uring.4"}
	if files[0] == base+".lookup.sync.1" { // the sync engine went first
		want = []string{base + ".lookup.sync.1", base + ".lookup.sync.4", base + ".lookup.uring.2", base + ".lookup.uring.3"}
	}
	require.Equal(t, want, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.True(t, bytes.HasPrefix(b, []byte("go 1.")), "%s: not a Go execution trace", f)
		// The regions' names in the trace's string table, each after its length.
		assert.True(t, bytes.Contains(b, []byte("\x06submit")) && bytes.Contains(b, []byte("\x04poll")), "%s: no call regions", f)
		assert.Contains(t, out, "written to "+f)
	}

	// mixed: a trace per phase.
	mixed := filepath.Join(t.TempDir(), "mx")
	mustRun(t, "mixed", "--dir", dir, "--engine", "sync", "--keys", "16", "--batch", "8", "--store-bytes", "8KiB", "--trace", mixed)
	files, err = filepath.Glob(mixed + ".*")
	require.NoError(t, err)
	assert.Equal(t, []string{mixed + ".mixed-baseline.sync.1", mixed + ".mixed-mixed.sync.2"}, files)

	code, _, stderr := tierbench(t, "lookup", "--dir", dir, "--duration", "100ms", "--trace", filepath.Join(dir, "missing", "tb"))
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "--trace")
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err)
	assert.Greater(t, cfg.Width, 800)
	assert.Greater(t, cfg.Height, 600)
}

// TestDistributions draws keys from each distribution (seeded) and checks
// its shape.
func TestDistributions(t *testing.T) {
	const n, draws = 1000, 100_000
	m := manifest{Seed: 3, Blocks: n, BlockSize: 4096}
	count := func(d distribution) map[string]int {
		ks := newKeySet(m, 1, d, missingBase, defaultMissKeys)
		seen := map[string]int{}
		for range draws {
			seen[string(ks.next())]++
		}
		return seen
	}
	// Uniform: each key in turn, draws/n times each.
	for _, c := range count(distribution{name: "uniform"}) {
		require.Equal(t, draws/n, c)
	}
	// Hot: 90% of the picks go to 10% of the keys.
	ks := newKeySet(m, 1, distribution{name: "hot", hotKeys: 0.1, hotShare: 0.9}, missingBase, defaultMissKeys)
	hot := map[string]bool{}
	for _, k := range ks.present[:n/10] {
		hot[string(k)] = true
	}
	inHot := 0
	for range draws {
		if hot[string(ks.next())] {
			inHot++
		}
	}
	assert.InDelta(t, 0.9, float64(inHot)/draws, 0.01, "seed 3")
	// Zipf, s = 1.1: the most picked key takes far more than a uniform share.
	top := 0
	for _, c := range count(distribution{name: "zipf", zipfS: 1.1}) {
		top = max(top, c)
	}
	assert.Greater(t, top, 20*draws/n, "seed 3")

	// Prefix chains: a whole chain with probability hit, else a uniform
	// prefix; the rest are missing keys.
	const hit, l = 0.5, 8
	ks = newKeySet(m, hit, distribution{name: "uniform"}, missingBase, defaultMissKeys)
	present := map[string]bool{}
	for _, k := range ks.present {
		present[string(k)] = true
	}
	keys := make([][]byte, l)
	found := 0
	const chains = 20_000
	for range chains {
		ks.chain(keys)
		k := 0
		for k < l && present[string(keys[k])] {
			k++
		}
		for _, key := range keys[k:] {
			require.False(t, present[string(key)], "a present key after the prefix")
		}
		found += k
	}
	want := hit + (1-hit)*float64(l-1)/(2*l)
	assert.InDelta(t, want, float64(found)/(chains*l), 0.01, "seed 3")

	// Misses (--miss-keys): each a key outside the data set, the given
	// number of them in turn, then the same again.
	for _, misses := range []int{8, 3000} {
		ks = newKeySet(m, 0, distribution{name: "uniform"}, missingBase, misses)
		seen := map[string]int{}
		for range 2 * misses {
			k := ks.next()
			require.Len(t, k, keySize)
			require.False(t, present[string(k)], "a miss in the data set")
			seen[string(k)]++
		}
		require.Len(t, seen, misses, "--miss-keys %d", misses)
		for _, c := range seen {
			require.Equal(t, 2, c, "--miss-keys %d", misses)
		}
	}
}

// TestPrefixAndTuning runs the prefix workload and the tier-option flags.
func TestPrefixAndTuning(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "64", "--block-size", "4KiB")
	for _, hit := range []string{"1", "0"} {
		out := mustRun(t, "prefix", "--dir", dir, "--keys", "96", "--batch", "8", "--json", "--hit-ratio", hit, "--dist", "zipf")
		results, _ := jsonObjects(t, out)
		require.Len(t, results, 1)
		r := results[0]
		assert.Equal(t, "prefix", r["workload"])
		assert.Equal(t, 96.0, r["keys"])
		if hit == "1" {
			assert.Equal(t, 96.0, r["found"])
		} else {
			assert.Less(t, r["found"], 96.0*0.75)
		}
		assert.Equal(t, "zipf s=1.1", r["dist"])
	}
	out := mustRun(t, "lookup", "--dir", dir, "--keys", "96", "--batch", "8", "--engine", "sync",
		"--rings", "1", "--lookup-op", "openpath", "--ops-max", "32", "--workers-max", "8", "--sync-workers", "2",
		"--cache-ttl", "1s", "--breaker-threshold", "4", "--lookup-timeout", "2s", "--io-timeout", "3s", "--depth", "lookup=2,load=5")
	assert.Regexp(t, `(?m)^\s*sync\s+lookup\s+8\s+96\s`, out)
	out = mustRun(t, "store", "--dir", dir, "--keys", "16", "--batch", "4", "--durability", "full", "--json", "--depth", "store=2")
	results, _ := jsonObjects(t, out)
	require.Len(t, results, 1)
	assert.Equal(t, 2.0, results[0]["depth"])
	assert.Equal(t, 16.0, results[0]["found"])
}

func TestBadUsageOfNewFlags(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lookup", "--dir", dir, "--dist", "pareto"}, "--dist"},
		{[]string{"lookup", "--dir", dir, "--dist", "zipf", "--zipf-s", "1"}, "--zipf-s"},
		{[]string{"lookup", "--dir", dir, "--dist", "hot", "--hot-keys", "1.5"}, "--hot-keys"},
		{[]string{"lookup", "--dir", dir, "--depth", "lookup=0"}, "--depth"},
		{[]string{"lookup", "--dir", dir, "--depth", "lokup=3"}, "workload=N"},
		{[]string{"lookup", "--dir", dir, "--jobs", "0"}, "--jobs"},
		{[]string{"lookup", "--dir", dir, "--plot", "x.jpg"}, "--plot"},
		{[]string{"lookup", "--dir", dir, "--lookup-op", "stat"}, "--lookup-op"},
		{[]string{"store", "--dir", dir, "--durability", "always"}, "--durability"},
		{[]string{"lookup", "--dir", dir, "--interval", "1ms"}, "--interval"},
		{[]string{"run", "--workloads", "lookup,scan"}, "--workloads"},
		{[]string{"report"}, "want one FILE.jsonl"},
	} {
		code, stdout, stderr := tierbench(t, c.args...)
		assert.Equal(t, exitUsage, code, "%v", c.args)
		assert.Empty(t, stdout, "%v", c.args)
		assert.Contains(t, stderr, c.want, "%v", c.args)
	}
	_, stdout, _ := tierbench(t, "lookup", "-h")
	assert.NotContains(t, stdout, "job-index", "a hidden flag shows")
	assert.Contains(t, stdout, "--metrics-addr")
}

// TestMissKeysOfTheirOwn: with --miss-keys each workload's misses are keys
// that no workload before it in the process drew; without it, every
// workload draws the same 65,536.
func TestMissKeysOfTheirOwn(t *testing.T) {
	m := manifest{Seed: 3, Blocks: 100, BlockSize: 4096}
	draw := func(s *session) map[string]bool {
		ks, got := s.newKeySet(), map[string]bool{}
		for range 8 {
			got[string(ks.next())] = true
		}
		return got
	}
	own := newSession(&config{dist: "uniform", missKeys: 8, set: []string{"miss-keys"}}, "")
	own.setManifest(m)
	a, b := draw(own), draw(own)
	require.Len(t, a, 8)
	require.Len(t, b, 8)
	for k := range b {
		require.False(t, a[k], "a miss of the first workload again in the second")
	}
	shared := newSession(&config{dist: "uniform"}, "")
	shared.setManifest(m)
	require.Equal(t, draw(shared), draw(shared))
}
