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
	if t.local {
		take = syncTake
	}
	b.syncPool = newSyncPool(t, s, t.opts.SyncWorkers, take, nil, nil)
	return b, nil
}

// syncTake is how many queued ops a sync engine worker takes at once on a
// local filesystem, where no system call waits long, while more ops wait
// than there are workers: one lock and one wake for them all. Warm lookups
// (BenchmarkLookup's fixture, 1,024-key batches), against a channel
// receive and send an op, 3 interleaved rounds: 1.19-1.37x the keys a
// second at 0.72-0.84x the CPU a key; 64 KiB loads at depth 4 (fewer ops
// than workers, taken one by one) 0.99-1.03x. Elsewhere (FUSE, NFS) a
// worker takes one: an op that hangs holds no other.
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
	ops    []op       // the shard's ops; a worker owns ops[i] between send and finished
	work   chan int32 // ops to run; capacity OpsMax, so sending never blocks
	notify func()     // called after a worker's ops are finished, if set
	ns     *nsDirFD   // the namespace directory; workers read its fd concurrently
	cfg    blockstore.Config
	take   int                      // ops a worker takes at once at most
	write  func(w *ringWrite) int32 // if set, makes O_DIRECT stores' writes: the io_uring engine's ring (uringBackend.ringWrite)
	wg     sync.WaitGroup

	mu    sync.Mutex
	doneQ []int32       // ops finished, for finished
	doneC chan struct{} // capacity 1: doneQ was added to
}

// newSyncPool starts workers goroutines for shard s's ops; write, if not
// nil, makes O_DIRECT stores' writes (syncPool.write).
func newSyncPool(t *Tier, s *shard, workers, take int, notify func(), write func(w *ringWrite) int32) *syncPool {
	p := &syncPool{
		t:      t,
		ops:    s.ops,
		work:   make(chan int32, t.opts.OpsMax),
		notify: notify,
		write:  write,
		ns:     t.ns,
		cfg:    t.programConfig(t.store.DirCache(t.opts.Namespace)),
		take:   take,
		doneC:  make(chan struct{}, 1),
	}
	for range workers {
		p.wg.Add(1)
		go p.worker(workers)
	}
	return p
}

// send queues op i for a worker.
func (p *syncPool) send(i int32) { p.work <- i }

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
	close(p.work)
	p.wg.Wait()
}

// worker runs ops' programs to their outcome, one at a time, in a
// Program of its own on the heap (its steps point into it, and the kernel
// reads those paths: a goroutine's stack may move). While more ops wait
// than there are workers, it takes several, up to take, and hands them
// back together: one lock and one wake for them all.
func (p *syncPool) worker(workers int) {
	defer p.wg.Done()
	prog := make([]blockstore.Program, 1)
	hdr := alignedBytes(blockstore.ScratchSize)
	var w *ringWrite // the worker's one write on the ring, where the pool has them
	var write func(fd int, s *blockstore.Step) int32
	if p.write != nil {
		w = &ringWrite{res: make(chan int32, 1)}
		write = func(fd int, s *blockstore.Step) int32 {
			w.fd, w.s = fd, s
			return p.write(w)
		}
	}
	batch := make([]int32, 0, p.take)
	for i := range p.work {
		batch = append(batch[:0], i)
	take:
		for len(batch) < p.take && len(p.work) >= workers {
			select {
			case j, ok := <-p.work:
				if !ok {
					break take
				}
				batch = append(batch, j)
			default:
				break take
			}
		}
		for _, i := range batch {
			o := &p.ops[i]
			o.status, o.err = p.run(&prog[0], o, hdr, w, write)
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
// unless a store finds it gone. An O_DIRECT store's writes go through
// write (w's), where the pool has them (w not nil).
func (p *syncPool) run(prog *blockstore.Program, o *op, hdr []byte, w *ringWrite, write func(int, *blockstore.Step) int32) (Status, error) {
	if poolRun != nil {
		poolRun(o, p.notify != nil)
	}
	direct := p.t.engine.Direct && aligned(o.buf)
	if err := prog.Start(&p.cfg, programOp[o.kind], o.keyBytes(), o.buf, hdr, direct); err != nil {
		return StatusFailed, err
	}
	dir := p.ns.currentAt(o.started)
	onRing := w != nil && o.kind == OpStore && direct && o.ringWrite
	if onRing {
		w.o, w.broken = o, nil
	}
	for {
		if onRing {
			prog.RunSyncWrites(dir, write)
		} else {
			prog.RunSync(dir)
		}
		if prog.Judge() {
			p.t.noteDisposal(prog)
			if onRing && w.broken != nil {
				return StatusFailed, w.broken
			}
			return tierStatus[prog.Status], prog.Err
		}
		if prog.Renew {
			prog.Renew = false
			dir = p.ns.renew(dir)
		}
	}
}
