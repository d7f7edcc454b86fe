package linux_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
)

// opLog records the FUSE requests of a faultfs mount by the file they were about, in order.
type opLog struct {
	mu  sync.Mutex
	ops map[string][]faultfs.Op
}

func (l *opLog) record(op faultfs.Op) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops[op.Path] = append(l.ops[op.Path], op)
	return true
}

// take empties the log and returns its requests by file: the temporary files of stores, or the rest.
func (l *opLog) take(temporary bool) map[string][]faultfs.Op {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := map[string][]faultfs.Op{}
	for p, ops := range l.ops {
		if strings.Contains(p, ".blk.tmp.") == temporary {
			c[p] = ops
		}
	}
	l.ops = map[string][]faultfs.Op{}
	return c
}

// TestChainsRunInOneWorker: on FUSE every step of a load or store goes to an io_uring kernel worker
// (a FUSE file takes no IOCB_NOWAIT), and the ring is made so that a chain's next step runs in the
// worker that ran the step before (no DEFER_TASKRUN, whose completions go back to the owner as task
// work, which then hands the next step to a worker again: a hand-off and a wake of the owner a step).
// The FUSE server sees the thread that sent each request: every load's OPEN and READs, and every
// store's CREATE, WRITEs and RENAME, come from one thread. A millisecond on each keeps
// many workers busy at once, so a step handed off anew would land on another worker.
func TestChainsRunInOneWorker(t *testing.T) {
	needRoot(t, "FUSE")
	fsys := mountFaultFS(t)
	tr := openTier(t, tier.EngineURing, fsys.Mountpoint(), func(o *tier.Options) { o.Buffers = 64 })
	require.False(t, tr.Engine().Inline, "FUSE: every step to a kernel worker")
	const n = 64

	l := &opLog{ops: map[string][]faultfs.Op{}}
	rule, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpCreate | faultfs.OpWrite | faultfs.OpFlush | faultfs.OpRename | faultfs.OpOpen | faultfs.OpRead,
		Path: tr.Namespace(), Latency: time.Millisecond, Filter: l.record})
	require.NoError(t, err)

	bufs := tr.Buffers()
	for i := range n {
		copy(bufs[i], payload(i, blockSize))
	}
	for r := range 4 {
		require.NoError(t, tr.Store(uint64(r+1), keyRange(16*r, 16*r+16), bufs[16*r:16*r+16]))
	}
	for _, res := range await(t, tr, 1, 2, 3, 4) {
		for _, k := range res.Keys {
			require.Equal(t, tier.StatusStored, k.Status, "%v", k.Err)
		}
	}
	stores := l.take(true)
	require.Len(t, stores, n, "every store's temporary file seen")

	for i := range n {
		clear(bufs[i])
	}
	for r := range 4 {
		require.NoError(t, tr.Load(uint64(r+11), keyRange(16*r, 16*r+16), bufs[16*r:16*r+16]))
	}
	for _, res := range await(t, tr, 11, 12, 13, 14) {
		for _, k := range res.Keys {
			require.Equal(t, tier.StatusLoaded, k.Status, "%v", k.Err)
		}
	}
	for i := range n {
		require.Equal(t, payload(i, blockSize), bufs[i], "block %d", i)
	}
	loads := l.take(false)
	require.Len(t, loads, n, "every load seen")
	require.Positive(t, rule.Fired())

	for name, c := range map[string]map[string][]faultfs.Op{"store": stores, "load": loads} {
		threads, split := map[uint32]bool{}, []string{}
		for p, ops := range c {
			require.GreaterOrEqual(t, len(ops), 2, "%s of %s: %v", name, p, ops)
			for _, op := range ops {
				require.NotZero(t, op.Tid, "%s of %s: %v sent on no thread's behalf", name, p, op.Kind)
				threads[op.Tid] = true
				if op.Tid != ops[0].Tid {
					split = append(split, fmt.Sprintf("%s: %v", p, ops))
					break
				}
			}
		}
		assert.Zero(t, len(split), "%d of %d %ss ran their steps on more than one thread, as %v", len(split), len(c), name, split[:min(len(split), 2)])
		for _, ops := range c {
			kinds := make([]string, len(ops))
			for i, op := range ops {
				kinds[i] = op.Kind.String()
			}
			t.Logf("%d %ss ran on %d kernel workers; one's requests: %s", len(c), name, len(threads), strings.Join(kinds, " "))
			break
		}
	}
}
