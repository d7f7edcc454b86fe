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
	b.syncPool = newSyncPool(t, s, t.opts.SyncWorkers, nil)
	return b, nil
}

func (b *syncBackend) start(i int32, o *op, done []int32) []int32 {
	b.work <- i
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
	select {
	case i := <-b.done:
		done = append(done, i)
	default:
		b.timer.Reset(d)
		select {
		case i := <-b.done:
			done = append(done, i)
		case <-b.wakeC:
		case <-b.timer.C:
		}
		b.timer.Stop()
	}
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
	ops    []op       // the shard's ops; a worker owns ops[i] between work and done
	work   chan int32 // ops to run; capacity OpsMax, so sending never blocks
	done   chan int32 // finished ops; capacity OpsMax, so a worker never blocks
	notify func()     // called after each op sent to done, if set
	ns     *nsDirFD   // the namespace directory; workers read its fd concurrently
	cfg    blockstore.Config
	wg     sync.WaitGroup
}

// newSyncPool starts workers goroutines for shard s's ops.
func newSyncPool(t *Tier, s *shard, workers int, notify func()) *syncPool {
	p := &syncPool{
		t:      t,
		ops:    s.ops,
		work:   make(chan int32, t.opts.OpsMax),
		done:   make(chan int32, t.opts.OpsMax),
		notify: notify,
		ns:     t.ns,
		cfg:    t.programConfig(t.store.DirCache(t.opts.Namespace)),
	}
	for range workers {
		p.wg.Add(1)
		go p.worker()
	}
	return p
}

// finished appends the ops that have finished to done, without waiting.
func (p *syncPool) finished(done []int32) []int32 {
	for {
		select {
		case i := <-p.done:
			done = append(done, i)
		default:
			return done
		}
	}
}

// close stops the workers, once no op is in flight.
func (p *syncPool) close() {
	close(p.work)
	p.wg.Wait()
}

// worker runs ops' programs to their outcome, one at a time, in a
// Program of its own on the heap (its steps point into it, and the kernel
// reads those paths: a goroutine's stack may move).
func (p *syncPool) worker() {
	defer p.wg.Done()
	prog := make([]blockstore.Program, 1)
	hdr := alignedBytes(blockstore.ScratchSize)
	for i := range p.work {
		o := &p.ops[i]
		o.status, o.err = p.run(&prog[0], o, hdr)
		if poolRan != nil {
			poolRan(o)
		}
		p.done <- i
		if p.notify != nil {
			p.notify()
		}
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
