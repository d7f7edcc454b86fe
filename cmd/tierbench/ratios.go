package main

import (
	"fmt"
	"slices"
	"strings"
)

// engineRatio compares two engines on one workload: in each round, the
// first engine's figure divided by the second's, measured one after the
// other, and the median of those ratios with their range. A VM's speed
// drifts from one minute to the next (README): ratios within a round
// hold where absolute figures do not.
type engineRatio struct {
	Type       string `json:"type"` // "engine_ratio"
	Workload   string `json:"workload"`
	Engine     string `json:"engine"`  // the numerator
	Against    string `json:"against"` // the denominator
	Rounds     int    `json:"rounds"`  // rounds with both engines' figures
	KeysPerSec spread `json:"keys_per_sec"`
	CPUPerKey  spread `json:"cpu_us_per_key"`
	CallerP999 spread `json:"caller_p999_us"`

	text string
}

// spread is a ratio's median over the rounds, its range, and each
// round's value in order.
type spread struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Rounds []float64 `json:"rounds"`
}

func newSpread(v []float64) spread {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	return spread{Median: (s[(n-1)/2] + s[n/2]) / 2, Min: s[0], Max: s[n-1], Rounds: v}
}

func (s spread) String() string {
	if len(s.Rounds) == 1 {
		return fmt.Sprintf("%.2f", s.Median)
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", s.Median, s.Min, s.Max)
}

// engineRatios compares the first engine of rs with each later one, per
// workload, in the order the workloads ran. Rows of jobs and of mixed's
// phases are not compared; a round missing either row, or with a zero
// figure, is left out of that ratio.
func engineRatios(rs []*result) []engineRatio {
	type key struct {
		round            int
		engine, workload string
	}
	rows := map[key]*result{}
	var engines, workloads []string
	rounds := 0
	for _, r := range rs {
		if r.Phase != "" || r.Job > 0 || r.Jobs > 1 {
			continue
		}
		if !slices.Contains(engines, r.Engine) {
			engines = append(engines, r.Engine)
		}
		if !slices.Contains(workloads, r.Workload) {
			workloads = append(workloads, r.Workload)
		}
		rows[key{r.Round, r.Engine, r.Workload}] = r
		rounds = max(rounds, r.Round)
	}
	var out []engineRatio
	for _, against := range engines[min(1, len(engines)):] {
		for _, w := range workloads {
			var keys, cpu, caller []float64
			for round := 1; round <= rounds; round++ {
				a, b := rows[key{round, engines[0], w}], rows[key{round, against, w}]
				if a == nil || b == nil || b.KeysPerSec == 0 || b.CPUUSPerKey == 0 || b.CallerUS.P999 == 0 {
					continue
				}
				keys = append(keys, a.KeysPerSec/b.KeysPerSec)
				cpu = append(cpu, a.CPUUSPerKey/b.CPUUSPerKey)
				caller = append(caller, a.CallerUS.P999/b.CallerUS.P999)
			}
			if len(keys) == 0 {
				continue
			}
			e := engineRatio{Type: "engine_ratio", Workload: w, Engine: engines[0], Against: against, Rounds: len(keys),
				KeysPerSec: newSpread(keys), CPUPerKey: newSpread(cpu), CallerP999: newSpread(caller)}
			of := ""
			if len(keys) > 1 {
				of = fmt.Sprintf(", median of %d rounds (range)", len(keys))
			}
			e.text = fmt.Sprintf("%s ÷ %s, %s%s: keys/s %v, cpu/key %v, caller p99.9 %v", e.Engine, e.Against, w, of,
				e.KeysPerSec, e.CPUPerKey, e.CallerP999)
			out = append(out, e)
		}
	}
	return out
}

// ratioLines is the text of ratios, one line each.
func ratioLines(ratios []engineRatio) string {
	var b strings.Builder
	for _, r := range ratios {
		b.WriteString(r.text + "\n")
	}
	return b.String()
}
