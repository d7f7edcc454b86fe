package tier

import (
	"runtime"
	"testing"
	"time"
)

// instantBackend ends every op as it starts, found, stored or deleted,
// with no system call, handing the ends back in chunks of 32 as a ring's
// owner reaps what completed inline: a tier on it spends only its own
// work, what BenchmarkLookupOwnCost measures. Lookups, stores and deletes
// only: a load would fill no buffer.
type instantBackend struct {
	s       *shard
	pending []int32
	wakeC   chan struct{}
	timer   *time.Timer
}

func newInstantBackend(t *Tier, s *shard) backend {
	return &instantBackend{s: s, wakeC: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
}

var instantStatus = [opKinds]Status{OpLookup: StatusFound, OpStore: StatusStored, OpDelete: StatusDeleted}

func (b *instantBackend) start(i int32, o *op, done []int32) []int32 {
	o.status, o.err = instantStatus[o.kind], nil
	if b.pending = append(b.pending, i); len(b.pending) < 32 {
		return done
	}
	done = append(done, b.pending...)
	b.pending = b.pending[:0]
	return done
}

func (b *instantBackend) wait(d time.Duration, done []int32) []int32 {
	if len(b.pending) > 0 {
		done = append(done, b.pending...)
		b.pending = b.pending[:0]
		return done
	}
	b.timer.Reset(d)
	select {
	case <-b.wakeC:
	case <-b.timer.C:
	}
	b.timer.Stop()
	return done
}

func (b *instantBackend) cancel(int32, *op) {}

func (b *instantBackend) wake() {
	select {
	case b.wakeC <- struct{}{}:
	default:
	}
}

func (b *instantBackend) wakeCalls() bool      { return false }
func (b *instantBackend) sleepsOnKernel() bool { return false }
func (b *instantBackend) close()               { b.s.t.ns.release(false) }

// BenchmarkLookupOwnCost is BenchmarkLookup's workload (1,024-key batches,
// two in flight, no lookup cache) on a tier whose backends end every op
// at once (instantBackend), an owner per CPU: the tier's own CPU a key,
// without the kernel's, and so without this VM's noise in the kernel's
// path walks. What the tier adds to a warm lookup on either engine. The
// engine is io_uring for its shard a CPU (its rings are never made), so
// the machine must have io_uring.
func BenchmarkLookupOwnCost(b *testing.B) {
	testBackend = newInstantBackend
	defer func() { testBackend = nil }()
	tr := benchTier(b, b.TempDir(), EngineURing, func(o *Options) { o.Rings = runtime.GOMAXPROCS(0) })
	keys := make([][]byte, lookupKeys)
	for i := range keys {
		keys[i] = testKey(i)
	}
	benchLookups(b, tr, keys)
}
