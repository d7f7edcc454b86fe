package tierprom

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/latency"
	"github.com/uringtier/uringtier/tier"
)

const blockSize = 4096

func key(i int) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	h := sha256.Sum256(b[:])
	return h[:]
}

// await polls tr until n results have come.
func await(t *testing.T, tr *tier.Tier, n int) []tier.Result {
	t.Helper()
	var got []tier.Result
	buf := make([]tier.Result, 4)
	deadline := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case <-tr.Ready():
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			require.FailNow(t, "timed out waiting for results")
		}
		k := tr.Poll(buf)
		for _, r := range buf[:k] {
			r.Keys = append([]tier.KeyResult(nil), r.Keys...)
			got = append(got, r)
		}
	}
	return got
}

func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	return byName
}

// value returns the value of the metric of family mf whose labels include
// want.
func value(t *testing.T, mf *dto.MetricFamily, want map[string]string) float64 {
	t.Helper()
	require.NotNil(t, mf)
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	require.FailNow(t, "no such metric", "%s %v", mf.GetName(), want)
	return 0
}

// TestCollector runs stores, lookups and loads on a tier and checks the
// metrics' names, types and values, that the counters moved, and that
// promlint finds nothing to fault.
func TestCollector(t *testing.T) {
	tr, err := tier.Open(t.TempDir(), tier.Options{BlockSize: blockSize, Namespace: "kv", Engine: tier.EngineSync})
	require.NoError(t, err)
	defer tr.Close(context.Background())
	c := NewCollector(tr, Options{ConstLabels: prometheus.Labels{"instance_role": "test"}})

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems, "promlint")
	before := gather(t, c)

	bufs := make([][]byte, 4)
	keys := make([][]byte, 4)
	for i := range bufs {
		bufs[i], keys[i] = make([]byte, blockSize), key(i)
	}
	require.NoError(t, tr.Store(1, keys, bufs))
	await(t, tr, 1)
	require.NoError(t, tr.Lookup(2, [][]byte{key(0), key(1), key(99)}))
	require.NoError(t, tr.Load(3, keys[:2], bufs[:2]))
	await(t, tr, 2)

	problems, err = testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems, "promlint")
	after := gather(t, c)

	types := map[string]dto.MetricType{
		"uringtier_requests_total":               dto.MetricType_COUNTER,
		"uringtier_keys_total":                   dto.MetricType_COUNTER,
		"uringtier_key_outcomes_total":           dto.MetricType_COUNTER,
		"uringtier_key_failures_total":           dto.MetricType_COUNTER,
		"uringtier_read_bytes_total":             dto.MetricType_COUNTER,
		"uringtier_written_bytes_total":          dto.MetricType_COUNTER,
		"uringtier_busy_submits_total":           dto.MetricType_COUNTER,
		"uringtier_lookup_cache_hits_total":      dto.MetricType_COUNTER,
		"uringtier_shared_lookups_total":         dto.MetricType_COUNTER,
		"uringtier_late_completions_total":       dto.MetricType_COUNTER,
		"uringtier_breaker_trips_total":          dto.MetricType_COUNTER,
		"uringtier_quarantined_blocks_total":     dto.MetricType_COUNTER,
		"uringtier_quarantine_failures_total":    dto.MetricType_COUNTER,
		"uringtier_removed_blocks_total":         dto.MetricType_COUNTER,
		"uringtier_remove_failures_total":        dto.MetricType_COUNTER,
		"uringtier_operations_in_flight":         dto.MetricType_GAUGE,
		"uringtier_requests_queued":              dto.MetricType_GAUGE,
		"uringtier_buffers_held":                 dto.MetricType_GAUGE,
		"uringtier_operations_stuck":             dto.MetricType_GAUGE,
		"uringtier_breaker_open":                 dto.MetricType_GAUGE,
		"uringtier_engine_info":                  dto.MetricType_GAUGE,
		"uringtier_operation_duration_seconds":   dto.MetricType_HISTOGRAM,
		"uringtier_request_duration_seconds":     dto.MetricType_HISTOGRAM,
		"uringtier_queue_wait_seconds":           dto.MetricType_HISTOGRAM,
		"uringtier_capacity_bytes":               dto.MetricType_GAUGE,
		"uringtier_usage_bytes":                  dto.MetricType_GAUGE,
		"uringtier_evictor":                      dto.MetricType_GAUGE,
		"uringtier_evicted_blocks_total":         dto.MetricType_COUNTER,
		"uringtier_evicted_bytes_total":          dto.MetricType_COUNTER,
		"uringtier_evictor_scans_total":          dto.MetricType_COUNTER,
		"uringtier_evictor_dirs_rescanned_total": dto.MetricType_COUNTER,
		"uringtier_touches_total":                dto.MetricType_COUNTER,
		"uringtier_touches_dropped_total":        dto.MetricType_COUNTER,
		"uringtier_ring_operations_total":        dto.MetricType_COUNTER,
	}
	for name, typ := range types {
		require.Contains(t, after, name)
		assert.Equal(t, typ, after[name].GetType(), name)
		for _, m := range after[name].GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			assert.Equal(t, "kv", labels["tier_namespace"], name)
			assert.Equal(t, "test", labels["instance_role"], name)
		}
	}
	assert.Len(t, after, len(types), "a metric without a test")

	for _, op := range []string{"lookup", "load", "store"} {
		assert.Zero(t, value(t, before["uringtier_requests_total"], map[string]string{"op": op}))
		assert.Equal(t, 1.0, value(t, after["uringtier_requests_total"], map[string]string{"op": op}), op)
		assert.Equal(t, 1.0, value(t, after["uringtier_request_duration_seconds"], map[string]string{"op": op}), op)
	}
	assert.Equal(t, 3.0, value(t, after["uringtier_keys_total"], map[string]string{"op": "lookup"}))
	assert.Equal(t, 2.0, value(t, after["uringtier_key_outcomes_total"], map[string]string{"op": "lookup", "status": "found"}))
	assert.Equal(t, 1.0, value(t, after["uringtier_key_outcomes_total"], map[string]string{"op": "lookup", "status": "missing"}))
	assert.Equal(t, 4.0, value(t, after["uringtier_key_outcomes_total"], map[string]string{"op": "store", "status": "stored"}))
	assert.Equal(t, 4.0, value(t, after["uringtier_operation_duration_seconds"], map[string]string{"op": "store"}))
	assert.Equal(t, float64(2*blockSize), value(t, after["uringtier_read_bytes_total"], nil))
	assert.Equal(t, float64(4*blockSize), value(t, after["uringtier_written_bytes_total"], nil))
	assert.Zero(t, value(t, after["uringtier_key_failures_total"], map[string]string{"op": "store", "reason": "nospace"}))
	// 4 stores, 1 lookup (the other 2 answered by the cache the stores taught), 2 loads.
	assert.Equal(t, 7.0, value(t, after["uringtier_ring_operations_total"], map[string]string{"ring": "0"}))
	assert.Equal(t, 1.0, value(t, after["uringtier_engine_info"], map[string]string{"engine": "sync", "direct": strconv.FormatBool(tr.Engine().Direct)}))
}

// TestCollectorCapacity: the evictor's and Delete's counts are exported.
func TestCollectorCapacity(t *testing.T) {
	const file = blockstore.HeaderSize + blockSize
	tr, err := tier.Open(t.TempDir(), tier.Options{BlockSize: blockSize, Namespace: "kv", Engine: tier.EngineSync,
		Capacity: 10 * file, EvictInterval: 10 * time.Millisecond, EvictMinAge: -1})
	require.NoError(t, err)
	defer tr.Close(context.Background())
	c := NewCollector(tr, Options{})
	keys := make([][]byte, 12)
	for i := range keys {
		keys[i] = key(i)
		require.NoError(t, tr.BlockStore().Put("kv", keys[i], make([]byte, blockSize)))
	}
	require.Eventually(t, func() bool { return tr.Stats().Evicted > 0 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tr.Delete(1, keys))
	await(t, tr, 1)
	st := tr.Stats()
	m := gather(t, c)
	assert.Equal(t, float64(10*file), value(t, m["uringtier_capacity_bytes"], nil))
	assert.Equal(t, 1.0, value(t, m["uringtier_evictor"], nil))
	assert.Equal(t, float64(st.Evicted), value(t, m["uringtier_evicted_blocks_total"], nil))
	assert.Equal(t, float64(st.EvictedBytes), value(t, m["uringtier_evicted_bytes_total"], nil))
	assert.Equal(t, 1.0, value(t, m["uringtier_evictor_scans_total"], nil))
	assert.Equal(t, float64(st.Outcomes[tier.OpDelete][tier.StatusDeleted]), value(t, m["uringtier_key_outcomes_total"], map[string]string{"op": "delete", "status": "deleted"}))
	assert.Positive(t, value(t, m["uringtier_key_outcomes_total"], map[string]string{"op": "delete", "status": "deleted"}))
}

// TestHistogramFolding checks how fine buckets fold into Prometheus
// buckets: each at its value, cumulative, with the sum of the values.
func TestHistogramFolding(t *testing.T) {
	c := &Collector{bounds: []float64{0.001, 0.01, 0.1}}
	d := prometheus.NewDesc("x_seconds", "x", []string{"op"}, nil)
	var counts latency.Counts
	for _, ms := range []float64{0.5, 0.9, 2, 3, 50, 200, 200} {
		counts.Record(time.Duration(ms * float64(time.Millisecond)))
	}
	ch := make(chan prometheus.Metric, 1)
	c.histogram(ch, d, &counts, "load")
	var m dto.Metric
	require.NoError(t, (<-ch).Write(&m))
	h := m.GetHistogram()
	assert.Equal(t, uint64(7), h.GetSampleCount())
	assert.InEpsilon(t, 0.4564, h.GetSampleSum(), latency.ErrorBound)
	var cum []uint64
	for _, b := range h.GetBucket() {
		cum = append(cum, b.GetCumulativeCount())
	}
	assert.Equal(t, []uint64{2, 4, 5}, cum)
}
