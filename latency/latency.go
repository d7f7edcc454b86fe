// Package latency records durations in a histogram of fixed size whose
// quantiles are accurate to a stated bound, in the manner of HdrHistogram:
// log-linear buckets, 32 to each power of two nanoseconds.
//
// # Error bound
//
// A duration d is counted in the bucket holding it; a bucket's value is its
// midpoint. Below 64 ns a bucket is one nanosecond wide, so its value is
// exact; above, a bucket starting at lo is at most lo/32 wide, so the value
// of any duration differs from the duration by at most 1/64 of it
// (ErrorBound, 1.5625%). Quantile returns the value of the bucket holding the
// nearest-rank sample quantile, and so is within ErrorBound of the exact
// sample quantile; Sum and Mean are within ErrorBound of the exact sum and
// mean. Durations of 2^38 ns (about 275 s) or more are counted as 2^38 ns
// less one; negative durations as zero.
//
// # Memory and concurrency
//
// A Histogram is Buckets atomic counters (8.5 KiB), whatever the number of
// durations recorded; Record is safe from any goroutine and allocates
// nothing. Counts is a plain snapshot for one goroutine, to compute
// quantiles from, subtract (the figures of an interval) or add (the figures
// of several processes).
package latency

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits  = 5            // log2 of the buckets per power of two
	subCount = 1 << subBits // buckets per power of two
	maxBits  = 38           // durations are counted up to 2^maxBits-1 ns

	// Buckets is the number of buckets of a histogram.
	Buckets = (maxBits - subBits + 1) * subCount

	// Max is the longest duration counted as itself; longer ones count as
	// Max.
	Max = time.Duration(1<<maxBits - 1)
)

// ErrorBound is the most by which a bucket's value differs from a duration
// it holds, relative to that duration.
const ErrorBound = 1.0 / (2 * subCount)

// Bucket returns the index of the bucket holding d.
func Bucket(d time.Duration) int {
	v := uint64(min(max(d, 0), Max))
	l := bits.Len64(v)
	if l <= subBits+1 {
		return int(v)
	}
	e := l - subBits - 1
	return e<<subBits + int(v>>e)
}

// Lower returns the shortest duration bucket i holds.
func Lower(i int) time.Duration {
	if i < 2*subCount {
		return time.Duration(i)
	}
	e := i>>subBits - 1
	return time.Duration(uint64(i-e<<subBits) << e)
}

// Width returns the number of distinct nanosecond durations bucket i holds.
func Width(i int) time.Duration {
	if i < 2*subCount {
		return 1
	}
	return time.Duration(1) << (i>>subBits - 1)
}

// Value returns bucket i's value: the midpoint of the durations it holds.
func Value(i int) time.Duration {
	return Lower(i) + (Width(i)-1)/2
}

// Histogram counts durations; the zero value is empty and ready. Its
// methods are safe for concurrent use.
type Histogram struct {
	counts [Buckets]atomic.Uint64
}

// Record counts d.
func (h *Histogram) Record(d time.Duration) { h.counts[Bucket(d)].Add(1) }

// Load copies the counts into dst. Each counter is read atomically, but
// durations recorded during Load may be in dst or not.
func (h *Histogram) Load(dst *Counts) {
	*dst = Counts{}
	h.AddTo(dst)
}

// AddTo adds the counts into dst, each counter read atomically as Load
// reads it.
func (h *Histogram) AddTo(dst *Counts) {
	for i := range h.counts {
		dst[i] += h.counts[i].Load()
	}
}

// Counts is a snapshot of a histogram: Counts[i] durations in bucket i.
type Counts [Buckets]uint64

// Record counts d; not safe for concurrent use.
func (c *Counts) Record(d time.Duration) { c[Bucket(d)]++ }

// Total returns the number of durations counted.
func (c *Counts) Total() uint64 {
	var n uint64
	for _, k := range c {
		n += k
	}
	return n
}

// Quantile returns the value of the bucket holding the nearest-rank
// quantile q (0 to 1) of the durations counted: the duration at rank
// ceil(q×Total), at least 1, in ascending order. It returns 0 when nothing
// was counted.
func (c *Counts) Quantile(q float64) time.Duration {
	n := c.Total()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(min(max(q, 0), 1) * float64(n)))
	rank = max(rank, 1)
	var seen uint64
	for i, k := range c {
		seen += k
		if seen >= rank {
			return Value(i)
		}
	}
	panic("latency: rank beyond the total")
}

// Min returns the value of the lowest bucket in use, or 0.
func (c *Counts) Min() time.Duration {
	for i, k := range c {
		if k > 0 {
			return Value(i)
		}
	}
	return 0
}

// Max returns the value of the highest bucket in use, or 0.
func (c *Counts) Max() time.Duration {
	for i := len(c) - 1; i >= 0; i-- {
		if c[i] > 0 {
			return Value(i)
		}
	}
	return 0
}

// Sum returns the sum of the durations counted, each taken as its
// bucket's value.
func (c *Counts) Sum() time.Duration {
	var s time.Duration
	for i, k := range c {
		if k > 0 {
			s += time.Duration(k) * Value(i)
		}
	}
	return s
}

// Mean returns Sum / Total, or 0.
func (c *Counts) Mean() time.Duration {
	n := c.Total()
	if n == 0 {
		return 0
	}
	return c.Sum() / time.Duration(n)
}

// Add adds o's counts to c.
func (c *Counts) Add(o *Counts) {
	for i := range c {
		c[i] += o[i]
	}
}

// Sub subtracts o, an earlier snapshot of the same histogram, from c,
// leaving what was counted in between.
func (c *Counts) Sub(o *Counts) {
	for i := range c {
		if o[i] > c[i] {
			panic(fmt.Sprintf("latency: bucket %d: subtracting %d from %d: not an earlier snapshot", i, o[i], c[i]))
		}
		c[i] -= o[i]
	}
}

// MarshalJSON encodes the buckets in use as [lower bound in ns, count]
// pairs, in ascending order. A value receiver, so that Counts inside a
// struct or array marshaled by value (tier.Stats) encode so too.
func (c Counts) MarshalJSON() ([]byte, error) {
	pairs := [][2]uint64{}
	for i, k := range c {
		if k > 0 {
			pairs = append(pairs, [2]uint64{uint64(Lower(i)), k})
		}
	}
	return json.Marshal(pairs)
}

// UnmarshalJSON decodes what MarshalJSON encodes, adding to c.
func (c *Counts) UnmarshalJSON(b []byte) error {
	var pairs [][2]uint64
	if err := json.Unmarshal(b, &pairs); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	for _, p := range pairs {
		if p[0] > uint64(Max) {
			return fmt.Errorf("latency: bucket at %d ns is beyond the histogram", p[0])
		}
		c[Bucket(time.Duration(p[0]))] += p[1]
	}
	return nil
}
