package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/uringtier/uringtier/tier"
)

// TestLabelDirect: a row says O_DIRECT for the workloads that move
// payloads, loads and stores, when the engine used it; lookups move none.
func TestLabelDirect(t *testing.T) {
	s := newSession(&config{}, t.TempDir())
	for _, direct := range []bool{true, false} {
		info := tier.EngineInfo{Kind: tier.EngineURing, Direct: direct}
		for w, want := range map[string]bool{"load": direct, "store": direct, "lookup": false, "prefix": false} {
			r := &result{Workload: w}
			s.label(r, info)
			assert.Equal(t, want, r.Direct, "%s, engine Direct %v", w, direct)
		}
	}
}
