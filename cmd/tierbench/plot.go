package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/uringtier/uringtier/latency"
)

// writePlot draws a run into a PNG or SVG file (by its extension), four
// panels: keys/s and p99 batch latency over time (from the intervals), and
// the distribution of batch latency and of the tier's kernel operation
// latency per engine and workload (from the results' histograms). With
// --jobs, the jobs' intervals are summed (keys/s) or their worst taken
// (p99), and the distributions are the merged ones.
func writePlot(path string, intervals []intervalSample, rs []*result) error {
	series := seriesOf(intervals)
	rs = summaryRows(rs)
	throughput := newPlot("Throughput over time", "seconds into the workload", "keys/s (log)")
	p99 := newPlot("Batch latency p99 over time", "seconds into the workload", "p99 (ms, log)")
	batchCDF := newPlot("Batch latency distribution (submit to poll)", "latency (ms, log)", "fraction of batches at or below")
	opCDF := newPlot("Kernel operation latency distribution", "latency (ms, log)", "fraction of key operations at or below")
	for _, p := range []*plot.Plot{throughput, p99} {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{}
	}
	for _, p := range []*plot.Plot{batchCDF, opCDF} {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, logTicks{}
		p.Y.Min, p.Y.Max = 0, 1
		p.Legend.Left = true // the curves rise to the right
	}
	lines := map[*plot.Plot]int{}
	add := func(p *plot.Plot, name string, xys plotter.XYs, style int) {
		if addLine(p, name, xys, style) {
			lines[p]++
		}
	}
	names := map[string]int{} // series name -> style index
	style := func(name string) int {
		if i, ok := names[name]; ok {
			return i
		}
		names[name] = len(names)
		return names[name]
	}
	var keys []string
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, name := range keys {
		pts := series[name]
		var tp, lat plotter.XYs
		for _, smp := range pts {
			if smp.KeysPerSec > 0 {
				tp = append(tp, plotter.XY{X: smp.T, Y: smp.KeysPerSec})
			}
			if smp.P99US > 0 {
				lat = append(lat, plotter.XY{X: smp.T, Y: smp.P99US / 1e3})
			}
		}
		add(throughput, name, tp, style(name))
		add(p99, name, lat, style(name))
	}
	for _, r := range rs {
		name := seriesName(r.Engine, r.Workload, r.Phase)
		if r.LatencyHist != nil {
			add(batchCDF, name, cdf(r.LatencyHist), style(name))
		}
		if r.OpLatencyHist != nil && r.Workload != "populate" {
			add(opCDF, name, cdf(r.OpLatencyHist), style(name))
		}
	}
	for _, p := range []*plot.Plot{throughput, p99} {
		// Time from the workload's start; headroom above the curves
		// for the legend.
		p.X.Min = 0
		p.Y.Max *= 4
	}
	for _, p := range []*plot.Plot{throughput, p99, batchCDF, opCDF} {
		if lines[p] == 0 {
			p.Title.Text += " (no data)"
			p.X.Scale, p.Y.Scale = plot.LinearScale{}, plot.LinearScale{}
			p.X.Tick.Marker, p.Y.Tick.Marker = plot.DefaultTicks{}, plot.DefaultTicks{}
		}
	}

	const w, h = 30 * vg.Centimeter, 22 * vg.Centimeter
	var canvas vg.CanvasWriterTo
	switch filepath.Ext(path) {
	case ".svg":
		canvas = vgsvg.New(w, h)
	case ".png":
		canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110), vgimg.UseBackgroundColor(color.White))}
	default:
		return fmt.Errorf("%s: want a .png or .svg file", path)
	}
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Centimeter / 2, PadBottom: vg.Centimeter / 2, PadLeft: vg.Centimeter / 2, PadRight: vg.Centimeter / 2}
	plots := [][]*plot.Plot{{throughput, p99}, {batchCDF, opCDF}}
	cells := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(cells[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Legend.Top, p.Legend.Left = true, false
	p.Add(plotter.NewGrid())
	return p
}

// addLine adds a line of xys named name, and reports whether there was one
// to add.
func addLine(p *plot.Plot, name string, xys plotter.XYs, style int) bool {
	if len(xys) == 0 {
		return false
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return false
	}
	l.Color = plotutil.Color(style)
	l.Dashes = plotutil.Dashes(style / 7)
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	return true
}

// logTicks marks a log axis at 1, 2 and 5 times the powers of ten, labelled
// in short human form (200k, 1.5M, 0.5), whatever the range; gonum's
// LogTicks labels only powers of ten, and a range within one decade got
// none.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: shortNumber(v)})
			}
		}
	}
	if len(ticks) < 2 {
		ticks = append(ticks, plot.Tick{Value: lo, Label: shortNumber(lo)}, plot.Tick{Value: hi, Label: shortNumber(hi)})
	}
	return ticks
}

// shortNumber prints v in three significant digits with k, M or G.
func shortNumber(v float64) string {
	for _, u := range []struct {
		f float64
		s string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= u.f {
			return strconv.FormatFloat(v/u.f, 'g', 3, 64) + u.s
		}
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// cdf is the cumulative distribution of h: for each bucket in use, its
// value in ms and the fraction of durations at or below it.
func cdf(h *latency.Counts) plotter.XYs {
	n := h.Total()
	if n == 0 {
		return nil
	}
	var xys plotter.XYs
	var seen uint64
	for i, k := range h {
		if k == 0 {
			continue
		}
		seen += k
		x := math.Max(float64(latency.Value(i))/1e6, 1e-4)
		xys = append(xys, plotter.XY{X: x, Y: float64(seen) / float64(n)})
	}
	return xys
}

// seriesName names a line: engine, workload and, for mixed, phase.
func seriesName(engine, workload, phase string) string {
	if phase != "" {
		return engine + " " + workload + " " + phase
	}
	return engine + " " + workload
}

// seriesOf groups intervals by engine, workload (and mixed's phase); the
// i-th intervals of a workload's jobs (or mixed's streams) are summed
// (keys/s, bytes/s) and their worst p99 kept.
func seriesOf(intervals []intervalSample) map[string][]intervalSample {
	type key struct {
		name   string
		job    int
		stream int
	}
	perJob := map[key][]intervalSample{}
	for _, smp := range intervals {
		k := key{seriesName(smp.Engine, smp.Workload, smp.Phase), smp.Job, smp.Stream}
		perJob[k] = append(perJob[k], smp)
	}
	out := map[string][]intervalSample{}
	for k, pts := range perJob {
		sum := out[k.name]
		for i, smp := range pts {
			if i == len(sum) {
				sum = append(sum, intervalSample{})
			}
			s := &sum[i]
			s.T = max(s.T, smp.T)
			s.KeysPerSec += smp.KeysPerSec
			s.BytesPerSec += smp.BytesPerSec
			s.P99US = max(s.P99US, smp.P99US)
		}
		out[k.name] = sum
	}
	return out
}

// summaryRows returns the rows that stand for a whole run: the sums where
// --jobs made them, else every row.
func summaryRows(rs []*result) []*result {
	var sums []*result
	for _, r := range rs {
		if r.Job < 0 {
			sums = append(sums, r)
		}
	}
	if len(sums) > 0 {
		return sums
	}
	return rs
}
