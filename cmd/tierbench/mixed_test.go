package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mixedRow is what TestMixed reads of a result line of mixed.
type mixedRow struct {
	Engine    string             `json:"engine"`
	Workload  string             `json:"workload"`
	Phase     string             `json:"phase"`
	Streams   int                `json:"streams"`
	Keys      int64              `json:"keys"`
	Batches   int64              `json:"batches"`
	Found     int64              `json:"found"`
	Missing   int64              `json:"missing"`
	Errors    int64              `json:"errors"`
	LatencyUS map[string]float64 `json:"latency_us"`
	FirstErr  string             `json:"first_error"`
}

// mixedOutput splits mixed's JSON lines into results, ratios and
// intervals.
func mixedOutput(t *testing.T, out string) (rows []string, ratios []mixRatio, intervals []intervalSample) {
	t.Helper()
	for _, line := range jsonLines(t, out) {
		var head struct{ Type string }
		require.NoError(t, json.Unmarshal([]byte(line), &head), line)
		switch head.Type {
		case "result":
			rows = append(rows, line)
		case "ratio":
			var r mixRatio
			require.NoError(t, json.Unmarshal([]byte(line), &r), line)
			ratios = append(ratios, r)
		case "interval":
			var smp intervalSample
			require.NoError(t, json.Unmarshal([]byte(line), &smp), line)
			intervals = append(intervals, smp)
		default:
			t.Fatalf("unexpected line %s", line)
		}
	}
	return rows, ratios, intervals
}

// TestMixed runs lookups, loads and stores at once on one tier with every
// engine: per engine, a row per workload of the baseline (no stores) and
// of the mixed phase, none with errors; a p99 ratio per reader workload
// that is the rows' p99s divided; and a data set grown by exactly the
// blocks the stores wrote, every one of them intact.
func TestMixed(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "populate", "--dir", dir, "--blocks", "64", "--block-size", "8KiB")
	blocks := readManifestT(t, dir).Blocks

	// Two lookup streams and two store streams, which share --store-bytes
	// (32 blocks).
	out := mustRun(t, "mixed", "--dir", dir, "--engine", "all", "--duration", "200ms", "--interval", "50ms", "--json",
		"--mix", "lookup=2,load=1,store=2", "--batch", "lookup=16,load=4,store=4", "--depth", "2", "--store-bytes", "256KiB")
	lines, ratios, intervals := mixedOutput(t, out)
	want := []struct {
		phase, workload string
		streams         int
	}{
		{phaseBaseline, "lookup", 2}, {phaseBaseline, "load", 1},
		{phaseMixed, "lookup", 2}, {phaseMixed, "load", 1}, {phaseMixed, "store", 2},
	}
	engines := resultEngines(t, "all", lines, len(want))
	rows := map[string]mixedRow{}
	for i, line := range lines {
		var r mixedRow
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		w := want[i%len(want)]
		require.Equal(t, engines[i/len(want)], r.Engine, line)
		require.Equal(t, w.phase, r.Phase, line)
		require.Equal(t, w.workload, r.Workload, line)
		assert.Equal(t, w.streams, r.Streams, line)
		assert.Zero(t, r.Errors, "%s %s %s: %s", r.Engine, r.Phase, r.Workload, r.FirstErr)
		assert.Positive(t, r.Batches, line)
		assert.Equal(t, r.Keys, r.Found+r.Missing, line)
		assert.Positive(t, r.LatencyUS["p50"], line)
		assert.LessOrEqual(t, r.LatencyUS["p50"], r.LatencyUS["p99"], line)
		if r.Workload == "store" {
			assert.Equal(t, r.Keys, r.Found, "every store succeeds")
			assert.LessOrEqual(t, r.Keys, int64(32), "the stores wrote more than --store-bytes")
			blocks += uint64(r.Keys)
		}
		rows[r.Engine+" "+r.Phase+" "+r.Workload] = r
	}
	require.Len(t, ratios, len(engines), "a ratio per engine")
	for i, ratio := range ratios {
		assert.Equal(t, engines[i], ratio.Engine)
		assert.Len(t, ratio.P99Ratio, 2, "lookup and load")
		for _, w := range []string{"lookup", "load"} {
			base, mixed := rows[ratio.Engine+" baseline "+w], rows[ratio.Engine+" mixed "+w]
			assert.Equal(t, base.LatencyUS["p99"], ratio.BaselineP99US[w], "%s %s", ratio.Engine, w)
			assert.Equal(t, mixed.LatencyUS["p99"], ratio.MixedP99US[w], "%s %s", ratio.Engine, w)
			assert.InEpsilon(t, mixed.LatencyUS["p99"]/base.LatencyUS["p99"], ratio.P99Ratio[w], 1e-9, "%s %s", ratio.Engine, w)
		}
		st := rows[ratio.Engine+" mixed store"]
		assert.Equal(t, st.Found*8192, ratio.StoredBytes)
	}
	// The baseline lasts 200ms, four intervals; the mixed phase may end
	// sooner than one, with the stores.
	streams := map[int]bool{}
	for _, smp := range intervals {
		assert.Contains(t, []string{phaseBaseline, phaseMixed}, smp.Phase)
		if smp.Phase == phaseBaseline && smp.Workload == "lookup" {
			streams[smp.Stream] = true
		}
	}
	assert.Equal(t, map[int]bool{0: true, 1: true}, streams, "intervals of both lookup streams")
	assert.Equal(t, blocks, readManifestT(t, dir).Blocks, "the manifest counts every block stored")

	// The table: a row per engine × workload × phase, a ratio line per
	// engine. The readers run to --keys; the stores as long as they do.
	pic := filepath.Join(t.TempDir(), "mixed.png")
	out = mustRun(t, "mixed", "--dir", dir, "--engine", "all", "--keys", "64", "--batch", "8", "--depth", "2", "--store-bytes", "0", "--plot", pic)
	checkPNG(t, pic)
	// io_uring may have been turned off machine-wide since the JSON run
	// (linux_test does that for a while).
	engines = []string{"uring", "sync"}
	if strings.Contains(out, "uring engine skipped") {
		engines = []string{"sync"}
	}
	for _, e := range engines {
		for _, row := range []string{"lookup +baseline", "load +baseline", "lookup +mixed", "load +mixed"} {
			assert.Regexp(t, `(?m)^\s*`+e+`\s+`+row+`\s+8\s+64\s.*\s0$`, out)
		}
		m := regexp.MustCompile(`(?m)^\s*` + e + `\s+store\s+mixed\s+8\s+([\d,]+)\s.*\s0$`).FindStringSubmatch(out)
		require.NotNil(t, m, "no store row of %s:\n%s", e, out)
		var n uint64
		_, err := fmt.Sscan(strings.ReplaceAll(m[1], ",", ""), &n)
		require.NoError(t, err)
		blocks += n
		assert.Regexp(t, `(?m)^`+e+`: p99 with stores ÷ without: lookup \d+\.\d\d \(\S+ → \S+\), load \d+\.\d\d \(\S+ → \S+\); the stores wrote .+ in \d+\.\d\ds$`, out)
	}
	assert.Equal(t, blocks, readManifestT(t, dir).Blocks, "the manifest counts every block stored")
	assert.Contains(t, mustRun(t, "verify", "--dir", dir), fmt.Sprintf("verified %d blocks", blocks))

	// Without the baseline: the mixed phase alone, and no ratio.
	out = mustRun(t, "mixed", "--dir", dir, "--engine", "sync", "--keys", "16", "--batch", "8", "--store-bytes", "8KiB", "--baseline=false", "--json")
	lines, ratios, _ = mixedOutput(t, out)
	assert.Len(t, lines, 3, "mixed lookup, load and store")
	assert.Empty(t, ratios)
}

func TestMixedBadUsage(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"mixed", "--dir", dir, "--mix", "2"}, "want workload=N"},
		{[]string{"mixed", "--dir", dir, "--mix", "lookup=1,load=1"}, "want store=N"},
		{[]string{"mixed", "--dir", dir, "--mix", "store=1"}, "want store=N"},
		{[]string{"mixed", "--dir", dir, "--mix", "lookup=-1,store=1"}, "want 0 or more"},
		{[]string{"mixed", "--dir", dir, "--mix", "lookup=64,store=1"}, "at most 64"},
		{[]string{"mixed", "--dir", dir, "--mix", "scan=1"}, "workload=N"},
		{[]string{"mixed", "--dir", dir, "--jobs", "2"}, "--jobs with mixed"},
		{[]string{"mixed", "--dir", dir, "--store-bytes", "lots"}, "not a size"},
	} {
		code, stdout, stderr := tierbench(t, c.args...)
		assert.Equal(t, exitUsage, code, "%v", c.args)
		assert.Empty(t, stdout, "%v", c.args)
		assert.Contains(t, stderr, c.want, "%v", c.args)
	}
}
