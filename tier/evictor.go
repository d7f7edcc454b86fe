package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
)

// The evictor keeps the namespace within Options.Capacity while the tier
// serves. Every tier with a capacity runs one; among all the tiers that
// share the namespace directory (processes, hosts), the one holding the
// directory's lease (blockstore.TryLease: a lock that NFSv4 and GlusterFS
// servers hold for the client) is the evictor, and the others neither scan
// nor delete: they try for the lease every EvictInterval, so one takes
// over within about that when the holder dies, and read the usage the
// holder publishes in the lease file, to refuse stores when it is full.
//
// The holder scans the tree once (blockstore.Index), then, every
// EvictInterval, re-reads only the directories whose mtime changed —
// unless statfs shows that the whole filesystem uses less than the high
// mark, when nothing can be over it. Above the high mark it takes the
// least recently used blocks older than EvictMinAge, re-reads each one's
// times (another process may have used it: see recency.go), and deletes
// them through the engine's queue, after every lookup, load and store
// queued (OpDelete, a batch of evictBatch at a time), down to the low
// mark. A load that opened a block before its removal reads it whole; one
// that comes after finds it missing.

// evictBatch is the most blocks one delete request of the evictor removes.
const evictBatch = 256

// minLookGap is the least time between two looks of an evictor, however
// pressed or poked.
const minLookGap = 10 * time.Millisecond

// pokeShare: a tier that has stored this share of the capacity since the
// usage was last counted has its evictor look at once (a holder counts
// and evicts, another learns the holder's latest count).
const pokeShare = 20

// stored counts n bytes this tier stored since the last count, and pokes
// the evictor when they add up to 1/pokeShare of the capacity.
func (t *Tier) stored(n int64) {
	t.cap.usage.Add(n)
	t.cap.ownStored.Add(n)
	if t.cap.sinceCount.Add(n) > t.cap.limit.Load()/pokeShare {
		t.cap.sinceCount.Store(0)
		select {
		case t.evictor.poke <- struct{}{}:
		default:
		}
	}
}

type evictor struct {
	t       *Tier
	stop    chan struct{}
	done    chan struct{}
	holder  string
	lease   *blockstore.Lease
	index   *blockstore.Index
	victims []blockstore.Victim
	own     chan *request
	keys    [][]byte
	dirty   bool // the index may miss changes: Refresh before trusting it
	state   []byte
	lastAt  int64           // when the holder counted the usage last learned from the lease file
	kick    chan chan error // EvictNow: run a pass now, say how it went
	poke    chan struct{}   // this tier stored much since the last count: look sooner
	pressed bool            // usage was above the high mark at the last look
	failing bool            // the filesystem failed the last look: logged once, until it recovers
	counted int64           // the usage after the last look
	countAt time.Time       // when that count was made
}

func newEvictor(t *Tier) *evictor {
	host, _ := os.Hostname()
	return &evictor{
		t:      t,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		holder: fmt.Sprintf("%s pid %d", host, os.Getpid()),
		own:    make(chan *request, 1),
		kick:   make(chan chan error),
		poke:   make(chan struct{}, 1),
	}
}

// estimate sets the usage stores are admitted against until the first
// count: the last one an evictor published in the lease file, else what
// the whole filesystem holds (an upper bound: on a filesystem fuller than
// the capacity, stores are refused until the evictor has counted).
// Without it, tiers opened together each admitted stores from zero while
// the first scan ran, and overshot the capacity threefold.
func (e *evictor) estimate() {
	t := e.t
	var sf unix.Statfs_t
	if err := unix.Statfs(t.nsDir, &sf); err == nil {
		total := int64(sf.Blocks) * sf.Bsize
		if s := t.opts.CapacityShare; s > 0 {
			t.cap.limit.Store(int64(s * float64(total)))
		}
		t.cap.usage.Store(total - int64(sf.Bfree)*sf.Bsize)
	}
	if _, state, err := blockstore.ReadLease(t.nsDir); err == nil {
		if usage, at, _, ok := parseState(state); ok {
			e.lastAt = at
			t.cap.usage.Store(usage)
			t.cap.countAt.Store(at) // without a rate: the holder may be long gone
		}
	}
}

// run is the evictor's goroutine, until stop.
func (e *evictor) run() {
	defer close(e.done)
	defer e.release()
	timer := time.NewTimer(e.t.opts.EvictInterval)
	defer timer.Stop()
	var reply chan error
	for {
		start := time.Now()
		err := e.tick(start)
		if reply != nil {
			reply <- err
			reply = nil
		}
		// Under pressure, look again as soon as the last look's cost
		// allows: stores keep coming between looks.
		next := e.t.opts.EvictInterval
		if e.pressed {
			next = min(next, max(minLookGap, 2*time.Since(start)))
		}
		timer.Reset(next)
		select {
		case <-e.stop:
			return
		case <-timer.C:
		case reply = <-e.kick:
		case <-e.poke:
			if wait := minLookGap - time.Since(start); wait > 0 {
				time.Sleep(wait)
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

func (e *evictor) stopped() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

// release gives up the lease.
func (e *evictor) release() {
	if e.lease != nil {
		e.lease.Close()
		e.lease, e.index = nil, nil
		e.t.cap.held.Store(false)
	}
}

// marks returns the capacity's high and low marks in bytes.
func (e *evictor) marks() (high, low int64) {
	limit := float64(e.t.cap.limit.Load())
	return int64(limit * e.t.opts.HighWatermark), int64(limit * e.t.opts.LowWatermark)
}

// tick is one look: take the lease or learn the usage, count, evict. It
// returns why it could not evict (for EvictNow), nil when it did its work.
func (e *evictor) tick(now time.Time) error {
	t := e.t
	fsUsed := int64(-1)
	var sf unix.Statfs_t
	if err := unix.Statfs(t.nsDir, &sf); err == nil {
		total, free := int64(sf.Blocks)*sf.Bsize, int64(sf.Bavail)*sf.Bsize
		fsUsed = total - int64(sf.Bfree)*sf.Bsize
		if s := t.opts.CapacityShare; s > 0 {
			t.cap.limit.Store(int64(s * float64(total)))
		}
		// Room for the stores each ring may have in flight, or none are
		// admitted: the disk is full of other files.
		if free < t.fileSize()*storesMax*int64(len(t.shards)) {
			t.cap.fullUntil.Store(now.Add(2 * t.opts.EvictInterval).UnixNano())
		} else {
			t.cap.fullUntil.Store(0)
		}
	}
	if e.lease == nil {
		if err := e.takeLease(); err != nil {
			return err
		}
	}
	if err := e.lease.Check(); err != nil {
		t.log.Warn("tier: evictor: lost the lease", "err", err)
		e.release()
		return err
	}
	high, low := e.marks()
	// This tier's stores that finish from here on may be missing from the
	// count: they are added to it, so that a count never forgets them
	// (which let one store past a full namespace).
	mark := t.cap.ownStored.Load()
	// The count is dated now, at the look's start: the walk reads
	// directories from then on, and stores that land in those it has read
	// are not in it. Extrapolating from the start errs high. From the
	// walk's end, on a GlusterFS client whose rescans took 0.3-1.8 s, the
	// estimate forgot what the other tiers stored meanwhile, and they
	// passed the capacity by 9% (13.1 MiB of 12).
	counted := now
	switch {
	case e.index == nil:
		if err := e.scan(); err != nil {
			return err
		}
	case !e.dirty && fsUsed >= 0 && fsUsed <= high:
		// The whole filesystem holds less than the high mark: nothing to
		// count. The usage stays the last count plus this tier's stores,
		// but no more than the filesystem holds: stores that finished
		// while the first scan ran are in both, and an estimate stuck
		// above the capacity refused every store, so that the filesystem
		// never grew enough to be counted again.
		e.pressed = false
		t.cap.rate.Store(0)
		e.count(min(t.cap.usage.Load(), fsUsed), now)
		return e.publish(e.counted, now)
	default:
		start := time.Now()
		rs, err := e.index.Refresh()
		t.cap.rescanned.Add(uint64(rs.Changed))
		t.log.Debug("tier: evictor: rescanned", "dirs", rs.Dirs, "changed", rs.Changed, "added", rs.Added, "removed", rs.Removed, "took", time.Since(start))
		if err != nil {
			return e.fail("rescan", err)
		}
		e.dirty = false
	}
	_, usage := e.index.Usage() // what is on disk, as far as the index knows: eviction's measure
	if !e.countAt.IsZero() {
		// What all tiers added since the last count, a second: part of
		// every tier's estimate until the next count.
		if ns := counted.Sub(e.countAt).Nanoseconds(); ns > 0 {
			rate := max(0, usage-e.counted) * int64(time.Second) / ns
			t.cap.rate.Store((rate + t.cap.rate.Load()) / 2)
		}
	}
	e.count(e.withOwn(usage, mark), counted)
	e.pressed = usage > high
	if usage > high {
		start := time.Now()
		before := usage
		freed, victims := e.evict(usage-low, now)
		_, usage = e.index.Usage()
		t.log.Debug("tier: evictor: evicted", "usage_before", before, "usage", usage, "victims", victims, "freed", freed, "took", time.Since(start))
		// Stores went on while it evicted: the next count measures them.
		e.count(e.withOwn(usage, mark), counted)
		e.dirty = true // it deleted: its own changes
	}
	if err := e.publish(e.counted, counted); err != nil {
		return err
	}
	e.recovered()
	return nil
}

// withOwn is usage, the index's count, plus this tier's stores since
// ownStored was mark: what stores are admitted against. Some may be in the
// index already: the estimate errs high, never low, which let one store
// past a full namespace. Eviction goes by the index's count alone.
func (e *evictor) withOwn(usage, mark int64) int64 {
	return usage + e.t.cap.ownStored.Load() - mark
}

// fail logs the first of a run of failed looks (a filesystem that fails
// every second logs once) and returns err.
func (e *evictor) fail(what string, err error) error {
	if !e.failing {
		e.failing = true
		e.t.log.Warn("tier: evictor: "+what+" failed; retrying every EvictInterval", "err", err)
	}
	return err
}

// recovered logs the end of a run of failed looks.
func (e *evictor) recovered() {
	if e.failing {
		e.failing = false
		e.t.log.Info("tier: evictor: the filesystem answers again")
	}
}

// count makes usage, counted at at, the tier's count.
func (e *evictor) count(usage int64, at time.Time) {
	c := &e.t.cap
	e.counted, e.countAt = usage, at
	c.usage.Store(usage)
	c.countAt.Store(at.UnixNano())
	c.sinceCount.Store(0)
}

// takeLease tries for the lease; without it, it learns the holder's
// published usage, and returns an error wrapping ErrNotEvictor.
func (e *evictor) takeLease() error {
	t := e.t
	l, err := blockstore.TryLease(t.nsDir, e.holder)
	if err == nil {
		e.lease = l
		t.cap.held.Store(true)
		t.cap.holder.Store(&e.holder)
		t.log.Info("tier: evictor: holding the lease", "holder", e.holder)
		return nil
	}
	if !errors.Is(err, blockstore.ErrLeaseHeld) {
		return e.fail("lease", err)
	}
	holder, state, err := blockstore.ReadLease(t.nsDir)
	if err != nil {
		t.log.Debug("tier: evictor: reading the lease", "err", err)
		return fmt.Errorf("%w: %w", ErrNotEvictor, err)
	}
	t.cap.holder.Store(&holder)
	e.recovered()
	if usage, at, rate, ok := parseState(state); ok {
		// A new count replaces the estimate; until then this tier adds
		// the holder's rate, or its own stores, to the last one.
		if at != e.lastAt {
			e.lastAt = at
			t.cap.usage.Store(usage)
			t.cap.countAt.Store(at)
			t.cap.rate.Store(rate)
			t.cap.sinceCount.Store(0)
		}
		high, _ := e.marks()
		e.pressed = usage > high
	} else {
		t.log.Debug("tier: evictor: no usage in the lease", "state", string(state))
	}
	return fmt.Errorf("%w: %s holds the lease", ErrNotEvictor, holder)
}

// scan builds the index with one walk of the tree.
func (e *evictor) scan() error {
	t := e.t
	idx, err := t.store.NewIndex(t.opts.Namespace)
	if err == nil {
		err = idx.Scan(func(blocks, _ int64) { t.cap.scanned.Store(blocks) })
	}
	if err != nil {
		return e.fail("scan", err)
	}
	e.index = idx
	t.cap.scans.Add(1)
	blocks, bytes := idx.Usage()
	t.log.Info("tier: evictor: scanned", "blocks", blocks, "bytes", bytes)
	return nil
}

// EvictNow has the tier's evictor look at once, as it does every
// EvictInterval: take the lease if it can, count (a whole scan the first
// time), and evict down to the low mark if usage is above the high one.
// It returns when that is done (Stats says what it did), or an error: the
// tier has no capacity, another process holds the lease (ErrNotEvictor),
// the filesystem failed, ctx ended, or the tier closed.
func (t *Tier) EvictNow(ctx context.Context) error {
	e := t.evictor
	if e == nil {
		return fmt.Errorf("%w: no Capacity", ErrInvalid)
	}
	reply := make(chan error, 1)
	select {
	case e.kick <- reply:
	case <-e.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-e.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// evict removes least recently used blocks worth need bytes, and returns
// the bytes freed and the victims chosen. Victims go a batch at a time:
// their times are read again (Index.RecheckAll), and those still unused
// are deleted. Those another process used since the index last read them
// stay (RecheckAll records their new times), and the next least recently
// used are chosen in their place, until need is freed, no block is
// eligible, or a round frees nothing and learns nothing new (a failing
// filesystem: the next look tries again). Without the rounds, a look among
// processes that load each other's blocks stopped 20-30% short of the low
// mark, and usage drifted above the high one.
func (e *evictor) evict(need int64, now time.Time) (int64, int) {
	var freed int64
	chosen := 0
	for freed < need && !e.stopped() {
		e.victims = e.index.Victims(need-freed, e.t.opts.EvictMinAge, now, e.victims[:0])
		if len(e.victims) == 0 {
			break
		}
		chosen += len(e.victims)
		progress, ok := false, true
		for rest := e.victims; len(rest) > 0 && freed < need && ok && !e.stopped(); {
			batch := rest[:min(len(rest), evictBatch)]
			rest = rest[len(batch):]
			checked, err := e.index.RecheckAll(batch)
			// Without an error, every victim dropped was gone or used
			// since: the index knows it now, and the next round does not
			// choose it for the same reason.
			progress = progress || err == nil && len(checked) < len(batch)
			if len(checked) == 0 {
				continue
			}
			n, gone, done := e.delete(checked)
			freed, ok = freed+n, done
			progress = progress || gone > 0
		}
		if !ok || !progress {
			break
		}
	}
	return freed, chosen
}

// delete removes the blocks of vs through the engine and returns the
// bytes freed, how many of vs the index forgot (deleted, or found
// missing), and false if the tier refused or is closing.
func (e *evictor) delete(vs []blockstore.Victim) (int64, int, bool) {
	t := e.t
	e.keys = e.keys[:0]
	for _, v := range vs {
		e.keys = append(e.keys, v.Key)
	}
	r, err := t.submitOwn(OpDelete, e.keys, e.own)
	if err != nil {
		return 0, 0, false
	}
	select {
	case <-e.own:
	case <-e.stop:
		return 0, 0, false
	}
	var freed int64
	gone := 0
	for i, k := range r.res {
		switch k.Status {
		case StatusDeleted:
			freed += vs[i].Size
			t.cap.evicted.Add(1)
			t.cap.evictedBytes.Add(uint64(vs[i].Size))
			e.index.Forget(vs[i])
			gone++
		case StatusMissing:
			e.index.Forget(vs[i])
			gone++
		}
	}
	t.releaseOwn(r)
	return freed, gone, true
}

// publish writes the usage counted at at, and the rate at which the tiers
// add to it, into the lease file for the other tiers.
func (e *evictor) publish(usage int64, at time.Time) error {
	e.state = append(e.state[:0], "usage "...)
	e.state = strconv.AppendInt(e.state, usage, 10)
	e.state = append(e.state, " at "...)
	e.state = strconv.AppendInt(e.state, at.UnixNano(), 10)
	e.state = append(e.state, " rate "...)
	e.state = strconv.AppendInt(e.state, e.t.cap.rate.Load(), 10)
	e.state = append(e.state, '\n')
	if err := e.lease.Publish(e.state); err != nil {
		return e.fail("publish", err)
	}
	return nil
}

// parseState reads a published state: "usage U at T rate R" (bytes, Unix
// ns, bytes a second; the rate may be missing).
func parseState(state []byte) (usage, at, rate int64, ok bool) {
	f := bytes.Fields(state)
	if len(f) < 4 || string(f[0]) != "usage" || string(f[2]) != "at" {
		return 0, 0, 0, false
	}
	usage, err1 := strconv.ParseInt(string(f[1]), 10, 64)
	at, err2 := strconv.ParseInt(string(f[3]), 10, 64)
	if len(f) >= 6 && string(f[4]) == "rate" {
		rate, _ = strconv.ParseInt(string(f[5]), 10, 64)
	}
	return usage, at, max(rate, 0), err1 == nil && err2 == nil
}
