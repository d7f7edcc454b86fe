package tier

import (
	"sync"
	"time"

	"github.com/uringtier/uringtier/blockstore"
)

// syncBackend runs blockstore's programs with plain system calls on a
// fixed pool of goroutines. A worker stuck in a hung filesystem stays
// stuck; the pool's size bounds how many can be, and the shard's deadlines
// and breaker treat them as the io_uring engine's stuck operations.
type syncBackend struct {
	*syncPool
	wakeC chan struct{}
	timer *time.Timer // owner-only
}

var _ backend = (*syncBackend)(nil)

// newSyncBackend sets up shard s's backend and starts its workers.
func newSyncBackend(t *Tier, s *shard) (*syncBackend, error) {
	b := &syncBackend{wakeC: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	take := 1
	if local, _ := inlineSafe(t.nsDir); local {
		take = syncTake
	}
	b.syncPool = newSyncPool(t, s, t.opts.SyncWorkers, take, nil)
	return b, nil
}

// syncTake is how many queued ops a sync engine worker takes at once on a
// local filesystem, where no system call waits long, so that the pool
// locks once for several: warm lookups (BenchmarkLookup's fixture, 1,024-key
// batches) made 1.12-1.16x the keys a second at 0.80-0.86x the CPU a key
// of a channel send and receive an op (3 interleaved rounds). Elsewhere
// (FUSE, NFS) a worker takes one: an op that hangs holds no other.
const syncTake = 8

func (b *syncBackend) start(i int32, o *op, done []int32) []int32 {
	b.send(i)
	return done
}

func (b *syncBackend) cancel(i int32, o *op) {} // a blocked system call cannot be canceled

func (b *syncBackend) wake() {
	select {
	case b.wakeC <- struct{}{}:
	default:
	}
}

func (b *syncBackend) wakeCalls() bool { return false }

func (b *syncBackend) sleepsOnKernel() bool { return false }

func (b *syncBackend) wait(d time.Duration, done []int32) []int32 {
	n := len(done)
	if done = b.finished(done); len(done) > n {
		return done
	}
	b.timer.Reset(d)
	select {
	case <-b.doneC:
	case <-b.wakeC:
	case <-b.timer.C:
	}
	b.timer.Stop()
	return b.finished(done)
}

func (b *syncBackend) close() {
	b.syncPool.close()
	b.ns.release(false)
}

// syncPool is a fixed pool of goroutines that run ops' programs to their
// outcome with plain system calls: the sync engine's, and the io_uring
// engine's store pool, for stores on a local filesystem
// (EngineInfo.StoresSync) and for loads on tmpfs (EngineInfo.LoadsSync).
type syncPool struct {
	t      *Tier
	ops    []op     // the shard's ops; a worker owns ops[i] between send and finished
	notify func()   // called after a worker's ops are finished, if set
	ns     *nsDirFD // the namespace directory; workers read its fd concurrently
	cfg    blockstore.Config
	take   int // ops a worker takes at once at most
	wg     sync.WaitGroup

	mu     sync.Mutex
	more   sync.Cond // on mu: work was queued, or the pool closed
	queue  []int32   // ops to run, from head on
	head   int
	idle   int           // workers waiting on more
	closed bool          // no more work comes
	doneQ  []int32       // ops finished, for finished
	doneC  chan struct{} // capacity 1: doneQ was added to
}

// newSyncPool starts workers goroutines for shard s's ops.
func newSyncPool(t *Tier, s *shard, workers, take int, notify func()) *syncPool {
	p := &syncPool{
		t:      t,
		ops:    s.ops,
		notify: notify,
		ns:     t.ns,
		cfg:    t.programConfig(t.store.DirCache(t.opts.Namespace)),
		take:   take,
		doneC:  make(chan struct{}, 1),
	}
	p.more.L = &p.mu
	for range workers {
		p.wg.Add(1)
		go p.worker(workers)
	}
	return p
}

// send queues op i for a worker.
func (p *syncPool) send(i int32) {
	p.mu.Lock()
	p.queue = append(p.queue, i)
	if p.idle > 0 {
		p.more.Signal()
	}
	p.mu.Unlock()
}

// finished appends the ops that have finished to done, without waiting.
func (p *syncPool) finished(done []int32) []int32 {
	p.mu.Lock()
	done = append(done, p.doneQ...)
	p.doneQ = p.doneQ[:0]
	p.mu.Unlock()
	return done
}

// close stops the workers, once no op is in flight.
func (p *syncPool) close() {
	p.mu.Lock()
	p.closed = true
	p.more.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

// worker runs ops' programs to their outcome, one at a time, in a
// Program of its own on the heap (its steps point into it, and the kernel
// reads those paths: a goroutine's stack may move). It takes its share of
// the queue, up to take ops, and hands them back together: one lock, not
// two channel operations, an op.
func (p *syncPool) worker(workers int) {
	defer p.wg.Done()
	prog := make([]blockstore.Program, 1)
	hdr := alignedBytes(blockstore.ScratchSize)
	batch := make([]int32, 0, p.take)
	p.mu.Lock()
	for {
		for p.head == len(p.queue) && !p.closed {
			p.idle++
			p.more.Wait()
			p.idle--
		}
		n := len(p.queue) - p.head
		if n == 0 {
			p.mu.Unlock()
			return
		}
		k := min(p.take, max(1, n/workers))
		batch = append(batch[:0], p.queue[p.head:p.head+k]...)
		if p.head += k; p.head == len(p.queue) {
			p.head, p.queue = 0, p.queue[:0]
		}
		p.mu.Unlock()
		for _, i := range batch {
			o := &p.ops[i]
			o.status, o.err = p.run(&prog[0], o, hdr)
			if poolRan != nil {
				poolRan(o)
			}
		}
		p.mu.Lock()
		p.doneQ = append(p.doneQ, batch...)
		p.mu.Unlock()
		select {
		case p.doneC <- struct{}{}:
		default:
		}
		if p.notify != nil {
			p.notify()
		}
		p.mu.Lock()
	}
}

// poolRun, when set (by tests), is called by a worker before it runs an
// op's program, with whether the pool is an io_uring engine's (the one
// whose workers notify an owner).
var poolRun func(o *op, uring bool)

// poolRan, when set (by tests), is called by a worker once an op's
// program has its outcome, before the owner learns of it.
var poolRan func(o *op)

// run executes o's program: one namespace directory for all its phases,
// unless a store finds it gone.
func (p *syncPool) run(prog *blockstore.Program, o *op, hdr []byte) (Status, error) {
	if poolRun != nil {
		poolRun(o, p.notify != nil)
	}
	if err := prog.Start(&p.cfg, programOp[o.kind], o.keyBytes(), o.buf, hdr, p.t.engine.Direct && aligned(o.buf)); err != nil {
		return StatusFailed, err
	}
	dir := p.ns.currentAt(o.started)
	for {
		prog.RunSync(dir)
		if prog.Judge() {
			p.t.noteDisposal(prog)
			return tierStatus[prog.Status], prog.Err
		}
		if prog.Renew {
			prog.Renew = false
			dir = p.ns.renew(dir)
		}
	}
}
