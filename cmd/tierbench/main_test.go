package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
	"github.com/uringtier/uringtier/uring"
)

// TestMain lets this test binary be a --jobs child process: tierbench
// starts its jobs as os.Executable(), which in a test is this binary.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// tiny is the tiny mode: a data set and workloads that take milliseconds.
var tiny = []string{"--blocks", "40", "--block-size", "8KiB", "--keys", "96", "--batch", "8", "--depth", "3"}

// tinyWorkload is tiny for lookup, load and store, which read the data set
// from the manifest.
var tinyWorkload = []string{"--keys", "96", "--batch", "8", "--depth", "3"}

// tierbench runs the command in-process and returns its exit status,
// stdout and stderr.
func tierbench(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	if writesBlocks(args) && !slices.Contains(args, "--keep-free") {
		// The tests' data sets take a few MiB: how full the host's disk
		// is must not decide whether their stores run.
		args = append(slices.Clip(args), "--keep-free", "0")
	}
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// writesBlocks says whether args run a command that takes --keep-free.
func writesBlocks(args []string) bool {
	return len(args) == 0 || strings.HasPrefix(args[0], "-") || args[0] == "run" || args[0] == "store"
}

// mustRun runs the command and requires exit status 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := tierbench(t, args...)
	require.Equal(t, exitOK, code, "tierbench %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout, stderr)
	return stdout
}

func args(sub string, dir string, more ...[]string) []string {
	a := []string{sub, "--dir", dir}
	for _, m := range more {
		a = append(a, m...)
	}
	return a
}

// resultEngines returns the engines of JSON result lines, and checks that
// they are what --engine asked for. Which engines "all" and "auto" pick
// depends on whether io_uring is usable at that moment (tests in
// linux_test turn it off machine-wide for a while), so the test accepts
// either, but never a uring row without its sync row.
func resultEngines(t *testing.T, engine string, lines []string, perEngine int) []string {
	t.Helper()
	var engines []string
	for i := 0; i < len(lines); i += perEngine {
		var r struct{ Engine string }
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &r), lines[i])
		engines = append(engines, r.Engine)
	}
	switch engine {
	case "all":
		if len(engines) != 1 {
			require.Equal(t, []string{"uring", "sync"}, engines)
		} else {
			require.Equal(t, []string{"sync"}, engines)
		}
	case "auto":
		require.Len(t, engines, 1)
		require.Contains(t, []string{"uring", "sync"}, engines[0])
	default:
		require.Equal(t, []string{engine}, engines)
	}
	require.Len(t, lines, perEngine*len(engines))
	return engines
}

func TestDefaultRunTiny(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	out := mustRun(t, tiny...)
	for _, e := range []string{"sync"} {
		for _, w := range []string{"lookup", "load", "store"} {
			assert.Regexp(t, `(?m)^\s*`+e+`\s+`+w+`\s+8\s+96\s`, out, "row %s × %s", e, w)
		}
	}
	for _, col := range []string{"keys/s", "bytes/s", "p50", "p99", "p99.9", "max", "caller max"} {
		assert.Contains(t, out, col)
	}
	assert.Regexp(t, `(?m)^sync: plain syscalls`, out)
	if strings.Contains(out, "uring: ") {
		assert.Regexp(t, `(?m)^\s*uring\s+lookup\s+8\s+96\s`, out)
		assert.Regexp(t, `(?m)^uring: io_uring, \d+ rings?, setup flags \S+; (stores as plain syscalls on a pool of goroutines(, their writes on the rings when many are in flight)? \(a local filesystem\)|loads and stores as plain syscalls on a pool of goroutines \(tmpfs\)); loads and stores (with O_DIRECT|through the page cache \(.+\))$`, out)
	}
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries, "the temporary directory was not removed")
}

// jsonFields are the documented fields of a result line, in order.
var jsonFields = []string{"engine", "workload", "keys", "batches", "seconds", "keys_per_sec", "bytes_per_sec",
	"found", "errors", "latency_us", "caller_max_us"}

// checkResultLine parses one JSON result and checks it field by field.
func checkResultLine(t *testing.T, line string, engine, workload string, keys int64, batch int64, hitRatio float64) {
	t.Helper()
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(line), &raw), line)
	for _, f := range jsonFields {
		require.Contains(t, raw, f, line)
	}
	// The documented fields come first, in the documented order.
	dec0 := json.NewDecoder(strings.NewReader(line))
	_, err := dec0.Token() // {
	require.NoError(t, err)
	var order []string
	for dec0.More() {
		tok, err := dec0.Token()
		require.NoError(t, err)
		order = append(order, tok.(string))
		var skip json.RawMessage
		require.NoError(t, dec0.Decode(&skip))
	}
	require.GreaterOrEqual(t, len(order), len(jsonFields))
	assert.Equal(t, jsonFields, order[:len(jsonFields)])
	var r struct {
		Engine      string             `json:"engine"`
		Workload    string             `json:"workload"`
		Keys        int64              `json:"keys"`
		Batches     int64              `json:"batches"`
		Seconds     float64            `json:"seconds"`
		KeysPerSec  float64            `json:"keys_per_sec"`
		BytesPerSec float64            `json:"bytes_per_sec"`
		Found       int64              `json:"found"`
		Errors      int64              `json:"errors"`
		LatencyUS   map[string]float64 `json:"latency_us"`
		CallerMaxUS float64            `json:"caller_max_us"`
		Missing     int64              `json:"missing"`
		BlockSize   int64              `json:"block_size"`
		CPUSeconds  float64            `json:"cpu_seconds"`
		CPUUSPerKey float64            `json:"cpu_us_per_key"`
		Sleeps      uint64             `json:"kernel_sleeps"`
		SleepsKey   float64            `json:"kernel_sleeps_per_key"`
	}
	dec := json.NewDecoder(strings.NewReader(line))
	require.NoError(t, dec.Decode(&r))
	assert.Equal(t, engine, r.Engine)
	assert.Equal(t, workload, r.Workload)
	assert.Equal(t, keys, r.Keys)
	assert.Equal(t, (keys+batch-1)/batch, r.Batches)
	assert.Positive(t, r.Seconds)
	assert.InEpsilon(t, float64(r.Keys)/r.Seconds, r.KeysPerSec, 1e-6)
	assert.Zero(t, r.Errors)
	assert.Equal(t, r.Keys, r.Found+r.Missing+r.Errors)
	switch {
	case workload == "store":
		assert.Equal(t, r.Keys, r.Found, "every store succeeds")
	case hitRatio == 1:
		assert.Equal(t, r.Keys, r.Found)
	case hitRatio == 0:
		assert.Zero(t, r.Found)
	default:
		assert.Positive(t, r.Found)
		assert.Positive(t, r.Missing)
	}
	if workload == "lookup" {
		assert.Zero(t, r.BytesPerSec)
	} else {
		assert.InDelta(t, float64(r.Found*r.BlockSize)/r.Seconds, r.BytesPerSec, 1e-6*r.BytesPerSec)
	}
	require.Len(t, r.LatencyUS, 4, "latency_us: %v", r.LatencyUS)
	p50, p99, p999, mx := r.LatencyUS["p50"], r.LatencyUS["p99"], r.LatencyUS["p999"], r.LatencyUS["max"]
	assert.Positive(t, p50)
	assert.LessOrEqual(t, p50, p99)
	assert.LessOrEqual(t, p99, p999)
	assert.LessOrEqual(t, p999, mx)
	assert.LessOrEqual(t, mx, r.Seconds*1e6, "a batch took longer than the run")
	assert.Positive(t, r.CallerMaxUS)
	assert.Positive(t, r.CPUSeconds, "cpu_seconds")
	assert.InEpsilon(t, r.CPUSeconds*1e6/float64(r.Keys), r.CPUUSPerKey, 1e-6, "cpu_us_per_key")
	assert.InDelta(t, float64(r.Sleeps)/float64(r.Keys), r.SleepsKey, 1e-9, "kernel_sleeps_per_key")
	if engine == "sync" {
		assert.Zero(t, r.Sleeps, "the sync engine's owners sleep on no ring")
	}
	assert.LessOrEqual(t, r.CallerMaxUS, r.Seconds*1e6)
}

func jsonLines(t *testing.T, out string) []string {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

func TestDefaultRunJSON(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	out := mustRun(t, append([]string{"run", "--json"}, tiny...)...)
	lines := jsonLines(t, out)
	engines := resultEngines(t, "all", lines, 3)
	i := 0
	for _, e := range engines {
		for _, w := range []string{"lookup", "load", "store"} {
			checkResultLine(t, lines[i], e, w, 96, 8, 0.9)
			i++
		}
	}
}

func TestSubcommands(t *testing.T) {
	dir := t.TempDir()
	out := mustRun(t, "populate", "--dir", dir, "--blocks", "40", "--block-size", "8KiB", "--seed", "7")
	assert.Contains(t, out, "populated "+dir)
	assert.Contains(t, out, "40 blocks of 8.0 KiB")

	// Key i is SHA-256(seed || i): block 39 is there, block 40 is not.
	s, err := blockstore.Open(dir, blockstore.Options{})
	require.NoError(t, err)
	for i, want := range map[uint64]bool{0: true, 39: true, 40: false} {
		has, err := s.Has("default", keyOf(nil, 7, i))
		require.NoError(t, err)
		assert.Equal(t, want, has, "block %d", i)
	}

	for _, engine := range []string{"auto", "uring", "sync", "all"} {
		if engine == "uring" && uring.Available() != nil {
			continue
		}
		t.Run(engine, func(t *testing.T) {
			for _, w := range []string{"lookup", "load"} {
				for _, hit := range []string{"1", "0", "0.5"} {
					out := mustRun(t, args(w, dir, tinyWorkload, []string{"--json", "--engine", engine, "--hit-ratio", hit})...)
					lines := jsonLines(t, out)
					engines := resultEngines(t, engine, lines, 1)
					h := map[string]float64{"1": 1, "0": 0, "0.5": 0.5}[hit]
					for i, e := range engines {
						checkResultLine(t, lines[i], e, w, 96, 8, h)
					}
				}
				out := mustRun(t, args(w, dir, tinyWorkload, []string{"--engine", engine})...)
				assert.Regexp(t, `(?m)^\s*\w+\s+`+w+`\s+8\s+96\s`, out)
			}
		})
	}

	before := readManifestT(t, dir)
	out = mustRun(t, args("store", dir, tinyWorkload, []string{"--json", "--engine", "sync"})...)
	checkResultLine(t, jsonLines(t, out)[0], "sync", "store", 96, 8, 1)
	assert.Equal(t, before.Blocks+96, readManifestT(t, dir).Blocks, "stores grow the data set")
	mustRun(t, args("store", dir, tinyWorkload)...)

	out = mustRun(t, "du", "--dir", dir, "--json")
	var du struct {
		Command    string
		Blocks     int64
		Bytes      int64
		Namespaces []struct {
			Namespace string
			Blocks    int64
			Bytes     int64
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &du))
	total := int64(40 + 96 + 96)
	assert.Equal(t, "du", du.Command)
	assert.Equal(t, total, du.Blocks)
	assert.Equal(t, total*(8192+blockstore.HeaderSize), du.Bytes)
	require.Len(t, du.Namespaces, 1)
	assert.Equal(t, "default", du.Namespaces[0].Namespace)
	assert.Contains(t, mustRun(t, "du", "--dir", dir), "232")

	out = mustRun(t, "verify", "--dir", dir, "--json")
	var v struct{ Blocks, Corrupt, Removed, Remaining int64 }
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	assert.Equal(t, total, v.Blocks)
	assert.Zero(t, v.Corrupt)
	assert.Contains(t, mustRun(t, "verify", "--dir", dir), "verified 232 blocks")

	// A temporary file of a writer that died, backdated past --older-than.
	tmp := filepath.Join(dir, "default", "ab", "cd", strings.Repeat("ab", 16)+"cd"+strings.Repeat("00", 15)+".blk.tmp.1.1")
	require.NoError(t, os.MkdirAll(filepath.Dir(tmp), 0o755))
	require.NoError(t, os.WriteFile(tmp, []byte("partial"), 0o644))
	out = mustRun(t, "clean", "--dir", dir, "--older-than", "1h", "--json")
	var cl struct{ Removed, Bytes int64 }
	require.NoError(t, json.Unmarshal([]byte(out), &cl))
	assert.Zero(t, cl.Removed, "a fresh temporary file is not removed")
	assert.Contains(t, mustRun(t, "clean", "--dir", dir, "--older-than", "0s"), "removed 1 temporary files")
	assert.NoFileExists(t, tmp)

	// The evictor takes no block used within the last second.
	backdate(t, dir, "default", time.Hour)
	out = mustRun(t, "evict", "--dir", dir, "--max-size", "10GiB")
	assert.Contains(t, out, "nothing to evict")
	out = mustRun(t, "evict", "--dir", dir, "--max-size", "1MiB", "--json")
	var ev struct {
		UsedSize  int64 `json:"used_size"`
		FreedSize int64 `json:"freed_size"`
		Removed   int64 `json:"removed"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ev))
	assert.Equal(t, total*(8192+blockstore.HeaderSize), ev.UsedSize)
	assert.LessOrEqual(t, ev.UsedSize-ev.FreedSize, int64(1<<20))
	assert.Positive(t, ev.Removed)
}

func readManifestT(t *testing.T, dir string) manifest {
	t.Helper()
	m, err := readManifest(dir, "default")
	require.NoError(t, err)
	return m
}

func TestVerifyFindsAndRepairsCorruption(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "10", "--block-size", "4KiB", "--namespace", "kv")
	// Flip one payload byte of block 3.
	path := filepath.Join(dir, "kv", string(blockstore.FanoutLayout{}.AppendPath(nil, keyOf(nil, 1, 3))))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	b := []byte{0}
	_, err = f.ReadAt(b, blockstore.HeaderSize+17)
	require.NoError(t, err)
	b[0] ^= 0x01
	_, err = f.WriteAt(b, blockstore.HeaderSize+17)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	code, out, stderr := tierbench(t, "verify", "--dir", dir, "--namespace", "kv")
	assert.Equal(t, exitFailure, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Contains(t, out, "corrupt: "+path)
	assert.Contains(t, out, "1 corrupt, 0 removed, 1 remain")
	assert.FileExists(t, path, "verify without --repair removed the block")

	code, out, _ = tierbench(t, "verify", "--dir", dir, "--namespace", "kv", "--json")
	assert.Equal(t, exitFailure, code)
	var v struct{ Blocks, Corrupt, Removed, Remaining int64 }
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	assert.Equal(t, int64(10), v.Blocks)
	assert.Equal(t, int64(1), v.Corrupt)
	assert.Equal(t, int64(1), v.Remaining)

	out = mustRun(t, "verify", "--dir", dir, "--namespace", "kv", "--repair")
	assert.Contains(t, out, "removed: "+path)
	assert.Contains(t, out, "1 corrupt, 1 removed, 0 remain")
	assert.NoFileExists(t, path)

	out = mustRun(t, "verify", "--dir", dir, "--namespace", "kv")
	assert.Contains(t, out, "verified 9 blocks")
	assert.Contains(t, out, "0 corrupt")
}

func TestBadUsage(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"lookup"}, "--dir is required"},
		{[]string{"lookup", "--dir", dir, "--hit-ratio", "1.5"}, "--hit-ratio"},
		{[]string{"lookup", "--dir", dir, "--miss-keys", "0"}, "--miss-keys"},
		{[]string{"lookup", "--dir", dir, "--engine", "fast"}, "--engine"},
		{[]string{"load", "--dir", dir, "--keys", "5", "--duration", "1s"}, "not both"},
		{[]string{"store", "--dir", dir, "--depth", "0"}, "--depth"},
		{[]string{"populate", "--dir", dir, "--block-size", "lots"}, "not a size"},
		{[]string{"run", "--namespace", "../up"}, "--namespace"},
		{[]string{"evict", "--dir", dir}, "--max-size is required"},
		{[]string{"verify", "--dir", dir, "extra"}, `unexpected argument "extra"`},
		{[]string{"lookup", "--dir", dir, "--rounds", "0"}, "--rounds 0"},
		{[]string{"lookup", "--dir", dir, "--rounds", "2", "--jobs", "2"}, "--rounds with --jobs"},
		{[]string{"mixed", "--dir", dir, "--rounds", "2"}, "--rounds with --jobs or mixed"},
		{[]string{"lookup", "--dir", dir, "--engine", "all", "--interleave", "-1"}, "--interleave -1"},
		{[]string{"lookup", "--dir", dir, "--interleave", "2"}, "--interleave: with --engine all alone"},
		{[]string{"lookup", "--dir", dir, "--engine", "all", "--interleave", "2", "--trace", "x"}, "--interleave: with --engine all alone"},
	} {
		code, stdout, stderr := tierbench(t, c.args...)
		assert.Equal(t, exitUsage, code, "%v", c.args)
		assert.Empty(t, stdout, "%v", c.args)
		assert.Contains(t, stderr, c.want, "%v", c.args)
		assert.Contains(t, stderr, "Usage:", "%v", c.args)
	}
	code, stdout, _ := tierbench(t, "lookup", "-h")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "-hit-ratio")
}

func TestFailures(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := tierbench(t, args("lookup", dir, tinyWorkload)...)
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "run tierbench populate")

	code, _, stderr = tierbench(t, "du", "--dir", filepath.Join(dir, "nonexistent"))
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "no such file or directory")

	mustRun(t, "populate", "--dir", dir, "--blocks", "4", "--block-size", "4KiB")
	code, _, stderr = tierbench(t, "populate", "--dir", dir, "--blocks", "4", "--block-size", "8KiB")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "already holds a data set")
}

func TestLatency(t *testing.T) {
	if err := faultfs.Available(); err != nil {
		t.Skipf("--latency needs FUSE: %v", err)
	}
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "16", "--block-size", "4KiB")
	for _, w := range []string{"lookup", "load", "store"} {
		out := mustRun(t, w, "--dir", dir, "--keys", "16", "--batch", "4", "--depth", "2", "--latency", "2ms", "--engine", "all", "--hit-ratio", "0.5", "--json")
		lines := jsonLines(t, out)
		for i, e := range resultEngines(t, "all", lines, 1) {
			checkResultLine(t, lines[i], e, w, 16, 4, 0.5)
			var r struct {
				LatencyUS struct{ P50 float64 } `json:"latency_us"`
				Sleeps    uint64                `json:"kernel_sleeps"`
			}
			require.NoError(t, json.Unmarshal([]byte(lines[i]), &r))
			// Every key needs at least a LOOKUP through FUSE, each 2ms late.
			assert.GreaterOrEqual(t, r.LatencyUS.P50, 2000.0, "%s %s: the latency did not apply", e, w)
			if e == "uring" {
				assert.Positive(t, r.Sleeps, "%s: its owners slept on the kernel while ops took 2 ms there", w)
			}
		}
	}
	out := mustRun(t, "lookup", "--dir", dir, "--keys", "8", "--batch", "4", "--latency", "1ms")
	assert.Contains(t, out, "served through FUSE")
}

// TestEngineLine: the engine line names what runs on the io_uring
// engine's pool: stores on a local filesystem (with O_DIRECT, but their
// writes), loads and every store on tmpfs, and loads alone on tmpfs with
// Options.StoresOnRing.
func TestEngineLine(t *testing.T) {
	e := tier.EngineInfo{Kind: tier.EngineURing, Rings: 2}
	for _, c := range []struct {
		stores, loads, direct bool
		want                  string
	}{
		{false, false, true, "; loads and stores with O_DIRECT"},
		{true, false, true, "; stores as plain syscalls on a pool of goroutines, their writes on the rings when many are in flight (a local filesystem); "},
		{true, false, false, "; stores as plain syscalls on a pool of goroutines (a local filesystem); "},
		{true, true, false, "; loads and stores as plain syscalls on a pool of goroutines (tmpfs); "},
		{false, true, false, "; loads as plain syscalls on a pool of goroutines (tmpfs); "},
	} {
		e.StoresSync, e.LoadsSync, e.Direct = c.stores, c.loads, c.direct
		line := engineLine(e)
		assert.Contains(t, line, c.want, "stores_sync %v, loads_sync %v, direct %v", c.stores, c.loads, c.direct)
		assert.Equal(t, c.stores || c.loads, strings.Contains(line, "pool of goroutines"), "%s", line)
	}
	e = tier.EngineInfo{Kind: tier.EngineURing, Rings: 2, Direct: true, LastPageApart: true}
	assert.Contains(t, engineLine(e), "loads and stores with O_DIRECT, a load's last page read apart")
}
