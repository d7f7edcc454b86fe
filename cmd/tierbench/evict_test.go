package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

// backdate sets the access and modification times of every block file
// under dir/ns to now-age: the evictor never takes a block used within
// the last second, and populate has just written them.
func backdate(t *testing.T, dir, ns string, age time.Duration) {
	t.Helper()
	old := time.Now().Add(-age)
	n := 0
	err := filepath.WalkDir(filepath.Join(dir, ns), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), "~") {
			return err
		}
		n++
		return os.Chtimes(p, old, old)
	})
	require.NoError(t, err)
	require.Positive(t, n, "no block files under %s", filepath.Join(dir, ns))
}

// blockPath is the file of data set key i (seed 1) in namespace ns.
func blockPath(dir, ns string, i uint64) string {
	return filepath.Join(dir, ns, string(blockstore.FanoutLayout{}.AppendPath(nil, keyOf(nil, 1, i))))
}

// evictJSON is evict's JSON line.
type evictJSON struct {
	Command   string `json:"command"`
	Namespace string `json:"namespace"`
	MaxSize   int64  `json:"max_size"`
	LowSize   int64  `json:"low_size"`
	UsedSize  int64  `json:"used_size"`
	FreedSize int64  `json:"freed_size"`
	Removed   int64  `json:"removed"`
}

func parseEvict(t *testing.T, out string) evictJSON {
	t.Helper()
	var ev evictJSON
	require.NoError(t, json.Unmarshal([]byte(out), &ev), out)
	return ev
}

// TestEvictOldest: above --max-size, evict removes the least recently used
// blocks, down to --low-size, and says so; below it, nothing.
func TestEvictOldest(t *testing.T) {
	const blocks, file = 20, 4096 + blockstore.HeaderSize
	for _, c := range []struct {
		name     string
		flags    []string
		wantGone int // the oldest blocks removed
	}{
		{"max", []string{"--max-size", strconv.Itoa(12 * file)}, 8},
		{"low", []string{"--max-size", strconv.Itoa(12 * file), "--low-size", strconv.Itoa(5 * file)}, 15},
		{"low0", []string{"--max-size", strconv.Itoa(12 * file), "--low-size", "0"}, 20},
		{"below", []string{"--max-size", strconv.Itoa(blocks * file)}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			mustRun(t, "populate", "--dir", dir, "--namespace", "kv", "--blocks", strconv.Itoa(blocks), "--block-size", "4KiB")
			// Block i was last used (20-i) hours ago: 0 is the oldest.
			for i := range uint64(blocks) {
				at := time.Now().Add(-time.Duration(blocks-i) * time.Hour)
				require.NoError(t, os.Chtimes(blockPath(dir, "kv", i), at, at))
			}
			out := mustRun(t, append([]string{"evict", "--dir", dir, "--namespace", "kv", "--json"}, c.flags...)...)
			ev := parseEvict(t, out)
			assert.Equal(t, "evict", ev.Command)
			assert.Equal(t, "kv", ev.Namespace)
			assert.Equal(t, int64(blocks*file), ev.UsedSize)
			assert.Equal(t, int64(c.wantGone), ev.Removed)
			assert.Equal(t, int64(c.wantGone*file), ev.FreedSize)
			for i := range uint64(blocks) {
				_, err := os.Stat(blockPath(dir, "kv", i))
				if int(i) < c.wantGone {
					assert.True(t, os.IsNotExist(err), "block %d (among the %d oldest) is still there", i, c.wantGone)
				} else {
					assert.NoError(t, err, "block %d (not among the %d oldest) was removed", i, c.wantGone)
				}
			}
			out = mustRun(t, append([]string{"evict", "--dir", dir, "--namespace", "kv"}, c.flags...)...)
			left := (blocks - c.wantGone) * file
			assert.Contains(t, out, "nothing to evict", "a second pass finds the namespace within --max-size")
			assert.Contains(t, out, humanize.IBytes(uint64(left))+" used in "+dir+" (namespace kv)")
		})
	}
}

// TestEvictText: the text output of a pass that evicts, and --min-age.
func TestEvictText(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "16", "--block-size", "4KiB")
	require.NoError(t, os.Remove(filepath.Join(dir, "~quarantine"))) // populate's tier made it
	// Blocks used just now stay with --min-age: nothing evicted, and why.
	out := mustRun(t, "evict", "--dir", dir, "--max-size", "40KiB", "--min-age", "1h")
	assert.Contains(t, out, "128 KiB used in "+dir+" (namespace default), above 40 KiB: nothing evicted; every block was used within the last second or --min-age (1h0m0s)")
	assert.NoDirExists(t, filepath.Join(dir, "~quarantine"), "evict made a quarantine directory")
	backdate(t, dir, "default", 2*time.Hour)
	out = mustRun(t, "evict", "--dir", dir, "--max-size", "40KiB")
	assert.Equal(t, "128 KiB used in "+dir+" (namespace default): evicted 11 least recently used blocks (88 KiB), now 40 KiB\n", out)
}

// TestEvictLeaseHeld: while another tier holds the namespace's lease,
// evict fails, naming the holder, and removes nothing.
func TestEvictLeaseHeld(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "16", "--block-size", "4KiB")
	backdate(t, dir, "default", time.Hour)
	tr, err := tier.Open(dir, tier.Options{BlockSize: 4096, Capacity: 1 << 30, EvictInterval: 20 * time.Millisecond, TouchInterval: -1})
	require.NoError(t, err)
	defer tr.Close(context.Background())
	require.Eventually(t, func() bool { return tr.Stats().Evictor }, 10*time.Second, 10*time.Millisecond, "the test's tier never took the lease")
	holder := tr.Stats().EvictorHolder
	require.NotEmpty(t, holder)

	code, out, stderr := tierbench(t, "evict", "--dir", dir, "--max-size", "16KiB")
	assert.Equal(t, exitFailure, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Empty(t, out)
	assert.Contains(t, stderr, holder+" holds the evictor's lease")
	assert.Contains(t, stderr, "namespace default in "+dir)
	for i := range uint64(16) {
		assert.FileExists(t, blockPath(dir, "default", i))
	}

	// Once it has gone, evict evicts.
	require.NoError(t, tr.Close(context.Background()))
	ev := parseEvict(t, mustRun(t, "evict", "--dir", dir, "--max-size", "16KiB", "--json"))
	assert.Equal(t, int64(16*(4096+blockstore.HeaderSize)), ev.UsedSize)
	assert.LessOrEqual(t, ev.UsedSize-ev.FreedSize, int64(16<<10))
	assert.Positive(t, ev.Removed)
}

// TestDuIndex: du's counts are the blocks populated, per namespace and in
// all, with and without --namespace.
func TestDuIndex(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--namespace", "a", "--blocks", "7", "--block-size", "4KiB")
	mustRun(t, "populate", "--dir", dir, "--namespace", "b", "--blocks", "12", "--block-size", "8KiB")
	type ns struct {
		Namespace string `json:"namespace"`
		Blocks    int64  `json:"blocks"`
		Bytes     int64  `json:"bytes"`
	}
	var du struct {
		Command    string `json:"command"`
		Blocks     int64  `json:"blocks"`
		Bytes      int64  `json:"bytes"`
		Namespaces []ns   `json:"namespaces"`
	}
	const h = blockstore.HeaderSize
	a, b := ns{"a", 7, 7 * (4096 + h)}, ns{"b", 12, 12 * (8192 + h)}
	require.NoError(t, json.Unmarshal([]byte(mustRun(t, "du", "--dir", dir, "--json")), &du))
	assert.Equal(t, "du", du.Command)
	assert.Equal(t, []ns{a, b}, du.Namespaces)
	assert.Equal(t, a.Blocks+b.Blocks, du.Blocks)
	assert.Equal(t, a.Bytes+b.Bytes, du.Bytes)

	du.Namespaces = nil
	require.NoError(t, json.Unmarshal([]byte(mustRun(t, "du", "--dir", dir, "--namespace", "b", "--json")), &du))
	assert.Equal(t, []ns{b}, du.Namespaces)
	assert.Equal(t, b.Blocks, du.Blocks)
	assert.Equal(t, b.Bytes, du.Bytes)

	out := mustRun(t, "du", "--dir", dir)
	assert.Regexp(t, `(?m)^\s+a\s+7\s+`, out)
	assert.Regexp(t, `(?m)^\s+b\s+12\s+`, out)
	assert.Regexp(t, `(?m)^\s+total\s+19\s+`, out)
}

// TestStoreCapacity: stores into a namespace above --capacity make the
// tier evict; the result says how much and that this tier was the
// evictor, and the run succeeds.
func TestStoreCapacity(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "64", "--block-size", "4KiB")
	backdate(t, dir, "default", time.Hour)
	// A second: the evictor's first pass, at the tier's opening, ends
	// within it.
	out := mustRun(t, "store", "--dir", dir, "--engine", "sync", "--duration", "1s", "--batch", "8", "--depth", "2",
		"--capacity", "256KiB", "--json")
	lines := jsonLines(t, out)
	require.Len(t, lines, 1, out)
	var r struct {
		Keys         int64  `json:"keys"`
		Found        int64  `json:"found"`
		Errors       int64  `json:"errors"`
		Full         int64  `json:"full"`
		Evicted      uint64 `json:"evicted"`
		EvictedBytes uint64 `json:"evicted_bytes"`
		Evictor      bool   `json:"evictor"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &r))
	assert.Positive(t, r.Keys)
	assert.Zero(t, r.Errors)
	assert.Equal(t, r.Keys, r.Found+r.Full)
	assert.Positive(t, r.Evicted, out)
	assert.Equal(t, r.Evicted*(4096+blockstore.HeaderSize), r.EvictedBytes)
	assert.True(t, r.Evictor)
}

// TestStoreFullNotError: stores the tier refuses for want of room end
// StatusFull: counted as full, in the table and JSON, and the exit status
// is 0.
func TestStoreFullNotError(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "64", "--block-size", "4KiB")
	// Every block is young, and stays: nothing can be evicted.
	args := []string{"store", "--dir", dir, "--engine", "sync", "--keys", "64", "--batch", "8", "--depth", "2",
		"--capacity", "64KiB", "--evict-min-age", "1h"}
	out := mustRun(t, append(args, "--json")...)
	var r struct{ Keys, Found, Errors, Full int64 }
	require.NoError(t, json.Unmarshal([]byte(jsonLines(t, out)[0]), &r))
	// Stores before the evictor's first count may be admitted.
	assert.Positive(t, r.Full, out)
	assert.Equal(t, r.Keys, r.Found+r.Full)
	assert.Zero(t, r.Errors)
	out = mustRun(t, args...)
	assert.Regexp(t, `(?m)^.*cpu/key\s+full\s+errors\s*$`, out)
	assert.Regexp(t, `(?m)^\s*sync\s+store\s+8\s+64\s.*\s[1-9][0-9]*\s+0\s*$`, out)
}

func TestEvictBadUsage(t *testing.T) {
	dir := t.TempDir()
	// A namespace that is not there is empty, and stays absent.
	ev := parseEvict(t, mustRun(t, "evict", "--dir", dir, "--namespace", "absent", "--max-size", "1MiB", "--json"))
	assert.Equal(t, evictJSON{Command: "evict", Namespace: "absent", MaxSize: 1 << 20, LowSize: 1 << 20}, ev)
	assert.NoDirExists(t, filepath.Join(dir, "absent"))

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"evict", "--dir", dir, "--max-size", "0"}, "--max-size 0: want a positive size"},
		{[]string{"evict", "--dir", dir, "--max-size", "1MiB", "--low-size", "2MiB"}, "is above --max-size"},
		{[]string{"evict", "--dir", dir, "--max-size", "1MiB", "--min-age", "-1s"}, "--min-age -1s"},
		// One namespace: with --layout vllm, one rank directory.
		{[]string{"evict", "--dir", dir, "--max-size", "1MiB", "--layout", "vllm"}, "--layout vllm needs --model"},
		{[]string{"store", "--dir", dir, "--capacity", "1MiB", "--capacity-share", "0.5"}, "--capacity 1.0 MiB, --capacity-share 0.5"},
		{[]string{"store", "--dir", dir, "--capacity-share", "2"}, "--capacity-share 2"},
	} {
		code, stdout, stderr := tierbench(t, c.args...)
		assert.Equal(t, exitUsage, code, "%v: %s", c.args, stderr)
		assert.Empty(t, stdout, "%v", c.args)
		assert.Contains(t, stderr, c.want, "%v", c.args)
	}
}

// TestReportProgress: a line per period while the scan runs, none after.
func TestReportProgress(t *testing.T) {
	defer func(d time.Duration) { evictProgressEvery = d }(evictProgressEvery)
	evictProgressEvery = 5 * time.Millisecond
	var stderr bytes.Buffer
	c := &config{command: "evict", stderr: &stderr}
	var blocks atomic.Int64
	var running atomic.Bool
	running.Store(true)
	stop := reportProgress(c, func() (int64, bool) { return blocks.Add(4096), running.Load() })
	time.Sleep(50 * time.Millisecond)
	running.Store(false)
	time.Sleep(20 * time.Millisecond)
	stop()
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.GreaterOrEqual(t, len(lines), 2, stderr.String())
	assert.Equal(t, "tierbench evict: scanned 4,096 blocks", lines[0])
	assert.Equal(t, "tierbench evict: scanned 8,192 blocks", lines[1])
	assert.Less(t, len(lines), 15, "lines after the scan ended:\n%s", stderr.String())
}

// TestStoreCapacityJobs: with --jobs, one job's tier evicts; the sum row
// adds every job's full stores and evictions.
func TestStoreCapacityJobs(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "64", "--block-size", "4KiB")
	backdate(t, dir, "default", time.Hour)
	out := mustRun(t, "store", "--dir", dir, "--engine", "sync", "--jobs", "2", "--duration", "1s", "--batch", "8", "--depth", "2",
		"--capacity", "256KiB", "--json")
	type row struct {
		Job, Jobs         int
		Keys, Found, Full int64
		Errors            int64
		Evicted           uint64 `json:"evicted"`
		EvictedBytes      uint64 `json:"evicted_bytes"`
		Evictor           bool   `json:"evictor"`
	}
	var rows []row
	for _, l := range jsonLines(t, out) {
		var r row
		require.NoError(t, json.Unmarshal([]byte(l), &r), l)
		rows = append(rows, r)
	}
	require.Len(t, rows, 3, out)
	sum := row{Job: -1, Jobs: 2}
	evictors := 0
	for _, r := range rows[:2] {
		assert.Zero(t, r.Errors)
		sum.Keys += r.Keys
		sum.Found += r.Found
		sum.Full += r.Full
		sum.Evicted += r.Evicted
		sum.EvictedBytes += r.EvictedBytes
		sum.Evictor = sum.Evictor || r.Evictor
		if r.Evictor {
			evictors++
		} else {
			assert.Zero(t, r.Evicted, "job %d evicted without the lease", r.Job)
		}
	}
	// One job holds the lease: no job closes its tier (and gives the lease
	// up) before every job has read its tier's figures.
	assert.Equal(t, 1, evictors, "one job holds the lease: %s", out)
	assert.Positive(t, sum.Evicted, out)
	assert.Equal(t, sum, rows[2])
}
