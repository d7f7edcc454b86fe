package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/tier"
)

// mixed runs lookups, loads and stores at once on one tier, as an
// inference scheduler does: its critical path (which blocks exist, load
// them) shares the tier with the offload of new blocks. Each stream is a
// driver with its own batches in flight; one goroutine submits for all of
// them and polls the one tier (driveAll). A run has two phases on the same
// tier: the baseline, the readers (lookup, prefix, load streams) alone, and
// the mixed phase, the readers with the stores. The report puts their p50
// and p99 side by side and says, per engine, how much the stores raised
// the readers' p99.

// Phases of mixed.
const (
	phaseBaseline = "baseline" // the mix without its stores
	phaseWarmup   = "warm-up"  // the readers before the baseline, unmeasured
	phaseMixed    = "mixed"    // the whole mix
)

// mixOrder is the order of the mix's workloads, readers first.
var mixOrder = []string{"lookup", "prefix", "load", "store"}

// mixStreamsMax bounds the streams of a mix: each holds its own batches
// and buffers.
const mixStreamsMax = 64

// untilHalted is the duration of a store stream with --store-bytes 0: it
// stores until the readers have stopped and driveAll halts it.
const untilHalted = time.Duration(math.MaxInt64)

// mixedFlags registers mixed's flags: every workload flag, and the mix.
func mixedFlags(fs *flag.FlagSet, c *config) {
	workloadFlags(false)(fs, c)
	c.mix = perOp{by: map[string]int{"lookup": 1, "load": 1, "store": 1}, text: "lookup=1,load=1,store=1"}
	fs.Var(&c.mix, "mix", "streams of each workload at once on the one tier, as workload=N,... (lookup, prefix, load, store); each keeps its own --depth batches of its --batch keys in flight")
	c.storeBytes = 1 << 30
	fs.Var(&c.storeBytes, "store-bytes", "payload the stores write in the mixed phase, all store streams together; then they stop and the phase ends (0: store as long as the readers run)")
	fs.BoolVar(&c.baseline, "baseline", true, "first run the mix without its stores (the baseline phase), for the p99 ratios")
}

// validateMix checks --mix and what mixed does not take.
func (c *config) validateMix() error {
	if c.mix.allSet {
		return usagef("--mix %v: want workload=N,... (e.g. lookup=1,load=1,store=1)", &c.mix)
	}
	total, readers := 0, 0
	for name, n := range c.mix.by {
		if n < 0 {
			return usagef("--mix %s=%d: want 0 or more streams", name, n)
		}
		total += n
		if name != "store" {
			readers += n
		}
	}
	if readers == 0 || c.mix.get("store", 0) == 0 {
		return usagef("--mix %v: want store=N and at least one of lookup, prefix and load (N ≥ 1)", &c.mix)
	}
	if total > mixStreamsMax {
		return usagef("--mix %v: %d streams, want at most %d", &c.mix, total, mixStreamsMax)
	}
	if c.jobs > 1 {
		return usagef("--jobs with mixed: the streams share one tier in one process; run mixed without --jobs")
	}
	return nil
}

// cmdMixed runs the mix against a populated --dir with each engine, and
// records the blocks its stores added.
func cmdMixed(ctx context.Context, c *config) error {
	s, err := populatedSession(c)
	if err != nil {
		return err
	}
	if !c.json {
		fmt.Fprintf(c.stdout, "tierbench mixed: %s in %s (namespace %s): %s blocks of %s\n%s\n\n", s.mixLimitText(), c.dir, c.namespace,
			humanize.Comma(int64(s.m.Blocks)), humanize.IBytes(uint64(s.m.BlockSize)), s.mixText())
	}
	stop, err := s.serveMetrics()
	if err != nil {
		return err
	}
	defer stop()
	s.noteStoreMount()
	all, err := s.runEngines(inTurn(func(kind tier.EngineKind) ([]*result, error) { return s.runMixed(ctx, kind) }))
	// The blocks stored are there also when a later engine failed.
	if s.stored > 0 {
		if werr := writeManifest(c.dir, c.dataSet(), s.m); err == nil {
			err = werr
		}
	}
	if err != nil {
		return err
	}
	s.ratios = mixRatios(all)
	return s.interrupted(ctx, s.report(all))
}

// mixStream is one stream of the mix.
type mixStream struct {
	name  string
	index int // among the streams of its workload
	w     workload
	depth int
	bufs  [][]byte // depth × w.batch of the tier's buffers, this stream's alone; nil for lookups
}

// runMixed runs the phases on one tier of engine kind, sized for the whole
// mix: its depth is every stream's depth, its buffers every load and store
// stream's.
func (s *session) runMixed(ctx context.Context, kind tier.EngineKind) ([]*result, error) {
	names := s.c.workloadNames()
	depth, batch, bufs := 0, 0, 0
	for _, name := range names {
		n := s.c.mix.get(name, 0)
		depth += n * s.depthFor(name)
		batch = max(batch, s.batchFor(name))
		if workloadOps[name] != tier.OpLookup {
			bufs += n * s.depthFor(name) * s.batchFor(name)
		}
	}
	tr, err := s.openTier(kind, depth, batch, bufs, true)
	if err != nil {
		return nil, err
	}
	defer closeTier(tr)
	s.metrics.set(tr)
	defer s.metrics.set(nil)
	streams := s.mixStreams(names, tr.Buffers())
	phases := []string{phaseMixed}
	if s.c.baseline {
		phases = []string{phaseBaseline, phaseMixed}
	}
	var out []*result
	var ev evictions
	var next uint64 // the next driver's stream
	if warm := s.warmup(""); warm > 0 {
		s.runPhase(ctx, tr, phaseWarmup, streams, &next, limits{duration: warm}) // unmeasured
	}
	for _, phase := range phases {
		if ctx.Err() != nil {
			break
		}
		if s.c.cold {
			s.dropCaches()
		}
		collect()
		stopTrace, err := s.startTrace("mixed-"+phase, tr.Engine().Kind.String())
		if err != nil {
			return out, err
		}
		rs := s.runPhase(ctx, tr, phase, streams, &next, s.limits())
		if err := stopTrace(); err != nil {
			return out, err
		}
		// The phase's evictions go to its store row, or its first.
		for i, r := range rs {
			if r.Workload == "store" || i == len(rs)-1 {
				ev.note(r, tr)
				break
			}
		}
		out = append(out, rs...)
	}
	return out, closeTier(tr)
}

// mixStreams returns the streams of the mix, each with its own share of
// bufs. The streams of a workload share its workload, in both phases: no
// key is in flight in two of them at once, and the mixed phase reads on
// where the baseline stopped (with the uniform distribution), so that it
// does not find the baseline's keys in the caches.
func (s *session) mixStreams(names []string, bufs [][]byte) []mixStream {
	var out []mixStream
	for _, name := range names {
		w, depth := s.newWorkload(name), s.depthFor(name)
		for i := range s.c.mix.get(name, 0) {
			st := mixStream{name: name, index: i, w: w, depth: depth}
			if w.op != tier.OpLookup {
				st.bufs, bufs = bufs[:depth*w.batch], bufs[depth*w.batch:]
			}
			out = append(out, st)
		}
	}
	return out
}

// runPhase runs the phase's streams at once (the baseline and the warm-up
// leave the stores out), the readers within readLim, and returns a row per
// workload. The phase ends when either side is done: when the readers
// have run --duration (or --keys each), the stores stop; when the stores
// have written --store-bytes, the readers stop. So every batch of the
// mixed phase ran alongside stores. Stream IDs are taken from *next, so
// that they differ on the tier for its lifetime and a late OpRelease of a
// batch of an earlier phase names no stream.
func (s *session) runPhase(ctx context.Context, tr *tier.Tier, phase string, streams []mixStream, next *uint64, readLim limits) []*result {
	info := tr.Engine()
	engine := info.Kind.String()
	stores := 0
	for _, st := range streams {
		if st.w.op == tier.OpStore {
			stores++
		}
	}
	var ds, readers, writers []*driver
	var of []mixStream // the stream of ds[i]
	for _, st := range streams {
		lim := readLim
		if st.w.op == tier.OpStore {
			if phase != phaseMixed {
				continue
			}
			lim = s.storeLimits(tr.BlockSize(), stores, st.index)
		}
		if iv := s.intervalEvery(); iv > 0 && phase != phaseWarmup {
			lim.interval = iv
			index := st.index
			lim.onInterval = func(smp intervalSample) {
				smp.Engine, smp.Phase, smp.Stream = engine, phase, index
				s.interval(smp)
			}
		}
		d := newDriver(ctx, tr, st.w, st.depth, st.bufs, lim)
		d.stream = *next
		*next++
		ds, of = append(ds, d), append(of, st)
		if st.w.op == tier.OpStore {
			writers = append(writers, d)
		} else {
			readers = append(readers, d)
		}
	}
	driveAll(ctx, tr, ds, func() bool { return allEnded(readers) || len(writers) > 0 && allEnded(writers) })
	s.m.Blocks = max(s.m.Blocks, s.storeBase+s.stored)

	var out []*result
	for _, name := range s.c.workloadNames() {
		var rs []*result
		for i, d := range ds {
			if of[i].name == name {
				s.label(d.res, info)
				rs = append(rs, d.res)
			}
		}
		if len(rs) == 0 {
			continue
		}
		r := mergeStreams(rs)
		r.Phase = phase
		out = append(out, r)
	}
	return out
}

// allEnded reports whether every driver of ds has ended.
func allEnded(ds []*driver) bool {
	for _, d := range ds {
		if !d.ended {
			return false
		}
	}
	return true
}

// storeLimits are the limits of store stream i of n: its share of
// --store-bytes, or, with --store-bytes 0, until the readers stop.
func (s *session) storeLimits(blockSize, n, i int) limits {
	if s.c.storeBytes == 0 {
		return limits{duration: untilHalted}
	}
	keys := (int64(s.c.storeBytes) + int64(blockSize) - 1) / int64(blockSize)
	share := keys / int64(n)
	if int64(i) < keys%int64(n) {
		share++
	}
	if share == 0 {
		// More streams than blocks to store: this one stores nothing,
		// at once (limits of no keys and no time).
		return limits{}
	}
	return limits{keys: share}
}

// mergeStreams is the row of a workload's streams in one phase: their
// counts add up and their histograms merge (sumResults), but the process's
// CPU time and the tier's counters, which every stream saw whole, are
// taken once: the longest-running stream's.
func mergeStreams(rs []*result) *result {
	if len(rs) == 1 {
		rs[0].Streams = 1
		return rs[0]
	}
	t := sumResults(rs)
	t.Job, t.Jobs, t.Streams = rs[0].Job, 1, len(rs)
	longest := rs[0]
	for _, r := range rs {
		if r.elapsed > longest.elapsed {
			longest = r
		}
	}
	t.cpu, t.Busy, t.Shared, t.opHist = longest.cpu, longest.Busy, longest.Shared, longest.opHist
	t.finish()
	return t
}

// mixRatio is what the stores did to the readers on one engine: the p99
// (and p50) of their batches in the mixed phase over the baseline's.
type mixRatio struct {
	Type          string             `json:"type"` // "ratio"
	Engine        string             `json:"engine"`
	P99Ratio      map[string]float64 `json:"p99_ratio"` // per reader workload: mixed p99 ÷ baseline p99
	P50Ratio      map[string]float64 `json:"p50_ratio"`
	BaselineP99US map[string]float64 `json:"baseline_p99_us"`
	MixedP99US    map[string]float64 `json:"mixed_p99_us"`
	StoredBytes   int64              `json:"stored_bytes"`  // payload the mixed phase's stores wrote
	StoreSeconds  float64            `json:"store_seconds"` // how long they ran
	text          string             // the line for people
}

// mixRatios returns a ratio per engine that ran both phases.
func mixRatios(rs []*result) []mixRatio {
	type key struct{ engine, phase, workload string }
	rows := map[key]*result{}
	var engines []string
	for _, r := range rs {
		if r.Phase == "" {
			continue
		}
		if !slices.Contains(engines, r.Engine) {
			engines = append(engines, r.Engine)
		}
		rows[key{r.Engine, r.Phase, r.Workload}] = r
	}
	var out []mixRatio
	for _, e := range engines {
		ratio := mixRatio{Type: "ratio", Engine: e, P99Ratio: map[string]float64{}, P50Ratio: map[string]float64{},
			BaselineP99US: map[string]float64{}, MixedP99US: map[string]float64{}}
		var parts []string
		for _, name := range mixOrder {
			base, mixed := rows[key{e, phaseBaseline, name}], rows[key{e, phaseMixed, name}]
			if name == "store" || base == nil || mixed == nil || base.LatencyUS.P99 == 0 || base.LatencyUS.P50 == 0 {
				continue
			}
			ratio.P99Ratio[name] = mixed.LatencyUS.P99 / base.LatencyUS.P99
			ratio.P50Ratio[name] = mixed.LatencyUS.P50 / base.LatencyUS.P50
			ratio.BaselineP99US[name], ratio.MixedP99US[name] = base.LatencyUS.P99, mixed.LatencyUS.P99
			parts = append(parts, fmt.Sprintf("%s %.2f (%s → %s)", name, ratio.P99Ratio[name], dur(base.LatencyUS.P99), dur(mixed.LatencyUS.P99)))
		}
		if len(parts) == 0 {
			continue
		}
		st := rows[key{e, phaseMixed, "store"}]
		stores := ""
		if st != nil {
			ratio.StoredBytes, ratio.StoreSeconds = st.Found*int64(st.BlockSize), st.Seconds
			stores = fmt.Sprintf("; the stores wrote %s in %.2fs", humanize.IBytes(uint64(ratio.StoredBytes)), st.Seconds)
		}
		ratio.text = fmt.Sprintf("%s: p99 with stores ÷ without: %s%s", e, strings.Join(parts, ", "), stores)
		out = append(out, ratio)
	}
	return out
}

// mixLimitText says how long each phase's readers run.
func (s *session) mixLimitText() string {
	if s.c.keys > 0 {
		return fmt.Sprintf("%s keys per reader stream and phase", humanize.Comma(s.c.keys))
	}
	return fmt.Sprintf("%v per phase", s.c.duration)
}

// mixText says what runs at once, and in which phases.
func (s *session) mixText() string {
	var streams []string
	for _, name := range s.c.workloadNames() {
		streams = append(streams, fmt.Sprintf("%s ×%d (batch %d, %d in flight)", name, s.c.mix.get(name, 0), s.batchFor(name), s.depthFor(name)))
	}
	stores := "stores run as long as the readers"
	if s.c.storeBytes > 0 {
		stores = fmt.Sprintf("stores of %s in all, which end the phase when done", humanize.IBytes(uint64(s.c.storeBytes)))
	}
	phases := "mixed"
	if s.c.baseline {
		phases = "baseline (without the stores), then mixed"
	}
	return fmt.Sprintf("streams at once on one tier: %s; phases: %s; %s", strings.Join(streams, ", "), phases, stores)
}
