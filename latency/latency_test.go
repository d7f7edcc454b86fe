package latency

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuckets checks that the buckets tile 0..Max without gaps or overlaps
// and that every bucket's value is within ErrorBound of each duration it
// holds.
func TestBuckets(t *testing.T) {
	require.Equal(t, 0, Bucket(0))
	require.Equal(t, Buckets-1, Bucket(Max))
	require.Equal(t, Buckets-1, Bucket(time.Hour), "beyond Max counts as Max")
	require.Equal(t, 0, Bucket(-time.Second), "negative counts as zero")
	next := time.Duration(0)
	for i := range Buckets {
		require.Equal(t, next, Lower(i), "bucket %d does not start where %d ended", i, i-1)
		lo, hi := Lower(i), Lower(i)+Width(i)-1
		require.Equal(t, i, Bucket(lo), "bucket %d: lower bound %v", i, lo)
		require.Equal(t, i, Bucket(hi), "bucket %d: upper bound %v", i, hi)
		for _, d := range []time.Duration{lo, hi} {
			if d > 0 {
				err := math.Abs(float64(Value(i)-d)) / float64(d)
				require.LessOrEqual(t, err, ErrorBound, "bucket %d [%v, %v]: value %v for %v", i, lo, hi, Value(i), d)
			}
		}
		next = hi + 1
	}
	require.Equal(t, Max+1, next, "the last bucket ends at Max")
}

// TestQuantileErrorBound records samples of known distributions (seeded)
// and checks each quantile against the exact nearest-rank quantile of the
// same samples: within ErrorBound, as the package documents.
func TestQuantileErrorBound(t *testing.T) {
	const seed = 20260611
	rng := rand.New(rand.NewPCG(seed, 1))
	dists := []struct {
		name string
		draw func() time.Duration
	}{
		// Log-normal around 4 ms (median), the shape of IO latency.
		{"lognormal", func() time.Duration { return time.Duration(4e6 * math.Exp(0.8*rng.NormFloat64())) }},
		// Uniform from 1 µs to 10 ms.
		{"uniform", func() time.Duration { return time.Microsecond + time.Duration(rng.Int64N(int64(10*time.Millisecond))) }},
		// Bimodal: page-cache hits at ~20 µs, device reads at ~3 ms.
		{"bimodal", func() time.Duration {
			if rng.IntN(10) < 7 {
				return time.Duration(20e3 * (1 + 0.2*rng.NormFloat64()))
			}
			return time.Duration(3e6 * (1 + 0.3*rng.NormFloat64()))
		}},
	}
	for _, dist := range dists {
		draw := dist.draw
		t.Run(dist.name, func(t *testing.T) {
			var h Histogram
			samples := make([]time.Duration, 200_000)
			for i := range samples {
				samples[i] = max(draw(), 1)
				h.Record(samples[i])
			}
			slices.Sort(samples)
			var c Counts
			h.Load(&c)
			require.Equal(t, uint64(len(samples)), c.Total())
			worst := 0.0
			for _, q := range []float64{0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1} {
				rank := max(int(math.Ceil(q*float64(len(samples)))), 1)
				exact := samples[rank-1]
				got := c.Quantile(q)
				err := math.Abs(float64(got-exact)) / float64(exact)
				worst = max(worst, err)
				assert.LessOrEqual(t, err, ErrorBound, "seed %d: q=%v: got %v, exact %v", seed, q, got, exact)
			}
			var sum time.Duration
			for _, d := range samples {
				sum += d
			}
			assert.InEpsilon(t, float64(sum), float64(c.Sum()), ErrorBound, "seed %d: sum", seed)
			assert.LessOrEqual(t, math.Abs(float64(c.Max()-samples[len(samples)-1]))/float64(samples[len(samples)-1]), ErrorBound)
			assert.LessOrEqual(t, math.Abs(float64(c.Min()-samples[0]))/float64(samples[0]), ErrorBound)
			t.Logf("worst quantile error %.3f%% (bound %.3f%%)", 100*worst, 100*ErrorBound)
		})
	}
}

// TestPowerOfTwoWasWorse documents the histogram this package replaced:
// 4.1 ms reported as a power-of-two bucket's upper bound read as 8.2 ms.
func TestPowerOfTwoWasWorse(t *testing.T) {
	var c Counts
	c.Record(4100 * time.Microsecond)
	assert.InEpsilon(t, 4100*time.Microsecond, c.Quantile(0.5), ErrorBound)
}

func TestAddSubJSON(t *testing.T) {
	var a, b Counts
	for i := range 1000 {
		a.Record(time.Duration(i) * time.Microsecond)
	}
	b = a
	for i := range 500 {
		b.Record(time.Duration(i) * time.Millisecond)
	}
	interval := b
	interval.Sub(&a)
	assert.Equal(t, uint64(500), interval.Total())
	assert.InEpsilon(t, 250*time.Millisecond, interval.Quantile(0.5), 2*ErrorBound)

	js, err := json.Marshal(&b)
	require.NoError(t, err)
	var back Counts
	require.NoError(t, json.Unmarshal(js, &back))
	assert.Equal(t, b, back)
	back.Add(&a)
	assert.Equal(t, 2*a.Total()+500, back.Total())

	inStruct, err := json.Marshal(struct{ H [2]Counts }{[2]Counts{a}})
	require.NoError(t, err)
	assert.Less(t, len(inStruct), 20000, "Counts in a struct by value encode as pairs too")

	assert.Panics(t, func() { a.Sub(&b) }, "subtracting a later snapshot")
	assert.Error(t, json.Unmarshal([]byte(`[[1099511627776,1]]`), &back), "a bucket beyond Max")
	var empty Counts
	assert.Zero(t, empty.Quantile(0.99))
	assert.Zero(t, empty.Mean())
}

func TestConcurrentRecord(t *testing.T) {
	var h Histogram
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 10_000 {
				h.Record(time.Duration(g*10_000+i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	var c Counts
	h.Load(&c)
	assert.Equal(t, uint64(40_000), c.Total())
}

func TestRecordDoesNotAllocate(t *testing.T) {
	var h Histogram
	allocs := testing.AllocsPerRun(1000, func() { h.Record(3 * time.Millisecond) })
	assert.Zero(t, allocs)
}

func BenchmarkRecord(b *testing.B) {
	var h Histogram
	d := time.Duration(0)
	for b.Loop() {
		h.Record(d)
		d += 997
	}
}
