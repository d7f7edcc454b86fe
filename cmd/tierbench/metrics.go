package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/uringtier/uringtier/tier"
	"github.com/uringtier/uringtier/tierprom"
)

// tierMetrics is a prometheus.Collector of whichever tier the run has
// open (tiers come and go, one per engine); between tiers it has nothing.
// It is unchecked (Describe sends nothing), since what it collects changes.
type tierMetrics struct {
	mu  sync.Mutex
	cur *tierprom.Collector
	job string // the job label, "0" without --jobs
}

// set makes tr the tier whose metrics are served; nil: none.
func (m *tierMetrics) set(tr *tier.Tier) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur = nil
	if tr != nil {
		m.cur = tierprom.NewCollector(tr, tierprom.Options{ConstLabels: prometheus.Labels{"job_index": m.job}})
	}
}

func (m *tierMetrics) Describe(chan<- *prometheus.Desc) {}

func (m *tierMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	cur := m.cur
	m.mu.Unlock()
	if cur != nil {
		cur.Collect(ch)
	}
}

// serveMetrics serves /metrics at --metrics-addr (in job j's process, at
// its port + j) until the returned function is called: the tier's metrics
// (tierprom), the Go runtime's and the process's. It says where on stderr.
func (s *session) serveMetrics() (stop func(), err error) {
	c := s.c
	if c.metricsAddr == "" || c.jobs > 1 && !s.child() {
		return func() {}, nil
	}
	addr := c.metricsAddr
	job := max(c.jobIndex, 0)
	s.metrics.job = strconv.Itoa(job)
	if host, port, err := net.SplitHostPort(addr); err == nil && job > 0 {
		if p, err := strconv.Atoi(port); err == nil && p > 0 {
			addr = net.JoinHostPort(host, strconv.Itoa(p+job))
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(c.stderr, "tierbench: metrics server: %v\n", err)
		}
	}()
	fmt.Fprintf(c.stderr, "tierbench: metrics at http://%s/metrics\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}
