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
	t     *Tier
	ops   []op       // the shard's ops; a worker owns ops[i] between work and done
	work  chan int32 // ops to run; capacity OpsMax, so start never blocks
	done  chan int32 // finished ops; capacity OpsMax, so a worker never blocks
	wakeC chan struct{}
	timer *time.Timer // owner-only
	ns    *nsDirFD    // the namespace directory; workers read its fd concurrently
	cfg   blockstore.Config
	wg    sync.WaitGroup
}

var _ backend = (*syncBackend)(nil)

// newSyncBackend sets up shard s's backend and starts its workers.
func newSyncBackend(t *Tier, s *shard) (*syncBackend, error) {
	b := &syncBackend{
		t:     t,
		ops:   s.ops,
		work:  make(chan int32, t.opts.OpsMax),
		done:  make(chan int32, t.opts.OpsMax),
		wakeC: make(chan struct{}, 1),
		timer: time.NewTimer(time.Hour),
		ns:    t.ns,
		cfg:   t.programConfig(t.store.DirCache(t.opts.Namespace)),
	}
	for range t.opts.SyncWorkers {
		b.wg.Add(1)
		go b.worker()
	}
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
	for {
		select {
		case i := <-b.done:
			done = append(done, i)
		default:
			return done
		}
	}
}

func (b *syncBackend) close() {
	close(b.work)
	b.wg.Wait()
	b.ns.release(false)
}

// worker runs ops' programs to their outcome, one at a time, in a
// Program of its own on the heap (its steps point into it, and the kernel
// reads those paths: a goroutine's stack may move).
func (b *syncBackend) worker() {
	defer b.wg.Done()
	p := make([]blockstore.Program, 1)
	hdr := alignedBytes(blockstore.ScratchSize)
	for i := range b.work {
		o := &b.ops[i]
		o.status, o.err = b.run(&p[0], o, hdr)
		b.done <- i
	}
}

// run executes o's program: one namespace directory for all its phases,
// unless a store finds it gone.
func (b *syncBackend) run(p *blockstore.Program, o *op, hdr []byte) (Status, error) {
	if err := p.Start(&b.cfg, programOp[o.kind], o.keyBytes(), o.buf, hdr, b.t.engine.Direct && aligned(o.buf)); err != nil {
		return StatusFailed, err
	}
	dir := b.ns.currentAt(o.started)
	for {
		p.RunSync(dir)
		if p.Judge() {
			b.t.noteDisposal(p)
			return tierStatus[p.Status], p.Err
		}
		if p.Renew {
			p.Renew = false
			dir = b.ns.renew(dir)
		}
	}
}
