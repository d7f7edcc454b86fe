package tier

import "math/bits"

// opIndex maps a key's hash to the lookup op in flight for it, so that
// requests share one op: an open-addressed table with linear probing, at
// most half full (a shard has at most OpsMax ops). A Go map did the same
// at several times the cost: its access, assignment and delete were 4% of
// the CPU of warm O_PATH lookups (perf record, BenchmarkLookup, a ring
// per CPU).
type opIndex struct {
	slots []opSlot
	shift uint // a hash's home slot is its top bits (the low ones pick the shard)
}

type opSlot struct {
	hash uint64
	op   int32 // op index + 1; 0: empty
}

func newOpIndex(ops int) opIndex {
	n := bits.Len(uint(2*ops - 1)) // 2^n >= 2*ops; ops >= 1, so n >= 1
	return opIndex{slots: make([]opSlot, 1<<n), shift: uint(64 - n)}
}

func (x *opIndex) home(h uint64) int { return int(h >> x.shift) }

func (x *opIndex) next(i int) int { return (i + 1) & (len(x.slots) - 1) }

// get returns the op in flight for hash h.
func (x *opIndex) get(h uint64) (int32, bool) {
	for i := x.home(h); x.slots[i].op != 0; i = x.next(i) {
		if x.slots[i].hash == h {
			return x.slots[i].op - 1, true
		}
	}
	return 0, false
}

// put records op j for hash h, in place of any op recorded for it.
func (x *opIndex) put(h uint64, j int32) {
	i := x.home(h)
	for x.slots[i].op != 0 && x.slots[i].hash != h {
		i = x.next(i)
	}
	x.slots[i] = opSlot{h, j + 1}
}

// remove forgets hash h if op j is the one recorded for it, and moves the
// entries after it back so that no probe sequence has a hole.
func (x *opIndex) remove(h uint64, j int32) {
	i := x.home(h)
	for ; x.slots[i].op != 0 && x.slots[i].hash != h; i = x.next(i) {
	}
	if x.slots[i].op != j+1 {
		return
	}
	for k := x.next(i); x.slots[k].op != 0; k = x.next(k) {
		// The entry at k may fill the hole at i unless its home lies
		// cyclically in (i, k].
		if home := x.home(x.slots[k].hash); (k-home)&(len(x.slots)-1) >= (k-i)&(len(x.slots)-1) {
			x.slots[i] = x.slots[k]
			i = k
		}
	}
	x.slots[i] = opSlot{}
}
