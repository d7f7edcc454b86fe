package tier

import (
	"sync/atomic"
	"time"
)

// capacity is what stores consult before they write: an estimate of the
// namespace's usage against its limit (Options.Capacity), kept by the
// evictor, and whether the filesystem has run out of space. Atomic: every
// owner reads it.
type capacity struct {
	limit      atomic.Int64 // bytes; 0: no limit
	usage      atomic.Int64 // bytes of blocks, as last counted plus this tier's stores since
	sinceCount atomic.Int64 // bytes this tier stored since the last count (or poke)
	ownStored  atomic.Int64 // bytes this tier stored, ever: what a count cannot have seen yet
	countAt    atomic.Int64 // Unix ns of the last count
	rate       atomic.Int64 // bytes a second all tiers added between the evictor's last two counts
	fullUntil  atomic.Int64 // Unix ns: the filesystem reported no space; stores are refused until then

	evicted      atomic.Uint64
	evictedBytes atomic.Uint64
	scans        atomic.Uint64
	scanned      atomic.Int64 // blocks the running full scan has seen
	rescanned    atomic.Uint64
	held         atomic.Bool
	holder       atomic.Pointer[string]
	touches      atomic.Uint64
	touchDropped atomic.Uint64
}

// noSpaceFor is how long stores are refused after the filesystem reported
// ENOSPC, unless the evictor finds room sooner.
const noSpaceFor = time.Second

// noteNoSpace records that a store met ENOSPC or EDQUOT: with a capacity
// set, later stores fail fast (StatusFull) until the evictor sees room.
func (t *Tier) noteNoSpace() {
	if t.capacityOn() {
		t.cap.fullUntil.Store(time.Now().Add(noSpaceFor).UnixNano())
	}
}

// capacityOn reports whether the tier bounds its usage.
func (t *Tier) capacityOn() bool { return t.opts.Capacity > 0 || t.opts.CapacityShare > 0 }

// full reports whether a store must be refused before it writes: the
// namespace is at its capacity (and the evictor has not made room yet),
// or the filesystem has no space.
func (t *Tier) full(now time.Time) bool {
	if !t.capacityOn() {
		return false
	}
	if now.UnixNano() < t.cap.fullUntil.Load() {
		return true
	}
	limit := t.cap.limit.Load()
	return limit > 0 && t.estimate(now)+t.fileSize() > limit
}

// estimate is the namespace's usage now, as this tier can tell: the last
// count, plus what all tiers have been adding since at the rate the
// evictor measured between its last two counts, or this tier's own stores
// since if they are more. Without the rate, each of N tiers admitted
// stores up to the capacity against a count the others were also filling,
// and three passed it by 60%.
func (t *Tier) estimate(now time.Time) int64 {
	c := &t.cap
	usage := c.usage.Load() // includes this tier's stores since the count
	if r := c.rate.Load(); r > 0 {
		dt := now.UnixNano() - c.countAt.Load()
		if extra := r*(dt/int64(time.Millisecond))/1000 - c.sinceCount.Load(); dt > 0 && extra > 0 {
			usage += extra
		}
	}
	return usage
}

// fileSize is the size of one block's file.
func (t *Tier) fileSize() int64 {
	return t.opts.Format.PayloadOffset() + int64(t.opts.BlockSize)
}
