package tier

import (
	"context"
	"hash/maphash"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leadTier opens an io_uring tier of two rings with the lookup cache on,
// and returns it with the shard of each test key i (shardOf) and a
// function that makes shard l lead the next large lookup.
func leadTier(t *testing.T) (tr *Tier, shardOf func(i int) int, lead func(l int)) {
	t.Helper()
	tr = openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Hour })
	require.Len(t, tr.shards, 2)
	shardOf = func(i int) int { return shardOfHash(maphash.Bytes(tr.seed, testKey(i)), len(tr.shards)) }
	lead = func(l int) { tr.leads.Store(uint32(l - 1 + len(tr.shards))) }
	return tr, shardOf, lead
}

// TestLargeLookupsLed: with the lookup cache on, a large lookup goes to one
// owner, its lead, which answers it from the shards' caches if they hold
// every key and otherwise hands it on to the other owners: the statuses
// the owners would give, each counted once, and no other owner woken for
// a lookup the caches answer.
func TestLargeLookupsLed(t *testing.T) {
	var handed atomic.Int32
	handedOn = func(*request, *shard) { handed.Add(1) }
	t.Cleanup(func() { handedOn = nil })
	tr, shardOf, lead := leadTier(t)
	n := 2 * ownersHashKeys
	idx, want := make([]int, n), make([]Status, n)
	var evens []int
	for i := range idx {
		idx[i], want[i] = i, StatusMissing
		if i%2 == 0 {
			evens, want[i] = append(evens, i), StatusFound
		}
	}
	put(t, tr, evens...)
	// newKey is a key not asked about yet, of shard si.
	next := 10_000
	newKey := func(si int) int {
		for shardOf(next) != si {
			next++
		}
		next++
		return next - 1
	}
	req := uint64(0)
	// ask looks keys up, shard l leading, and says what came back, how many
	// shards it was handed on to, and how many ops the owners started.
	ask := func(l int, prefix bool, keys []int) (got []Status, handOns int32, ops uint64) {
		t.Helper()
		handed.Store(0)
		started := func() (n uint64) {
			for _, s := range tr.shards {
				n += s.started.Load()
			}
			return n
		}
		before, outcomes := started(), tr.Stats().Outcomes[OpLookup]
		lead(l)
		req++
		submit := tr.Lookup
		if prefix {
			submit = tr.LookupPrefix
		}
		require.NoError(t, submit(req, testKeys(keys...)))
		got = statuses(await(t, tr, req)[req])
		after := tr.Stats().Outcomes[OpLookup]
		counted := uint64(0)
		for st := range after {
			counted += after[st] - outcomes[st]
		}
		assert.Equal(t, uint64(len(keys)), counted, "each key's outcome counted once")
		return got, handed.Load(), started() - before
	}

	got, handOns, ops := ask(0, false, idx)
	assert.Equal(t, want, got)
	assert.EqualValues(t, 1, handOns, "the caches start empty")
	assert.EqualValues(t, n, ops)

	// Behind the tier's back: only the caches can still say found.
	for _, i := range evens {
		require.NoError(t, tr.BlockStore().Delete(tr.Namespace(), testKey(i)))
	}
	for l := range tr.shards {
		hits := tr.Stats().CacheHits
		got, handOns, ops = ask(l, false, idx)
		assert.Equal(t, want, got, "lead %d", l)
		assert.Zero(t, handOns, "lead %d: the other shard's cache answered", l)
		assert.Zero(t, ops)
		assert.Equal(t, hits+uint64(n), tr.Stats().CacheHits)
	}

	// A key that a cache lacks, the lead's or the other's: the lookup is
	// handed on, and the key's owner asks the filesystem.
	for si := range tr.shards {
		keys := append(append([]int(nil), idx...), newKey(si))
		got, handOns, ops = ask(0, false, keys)
		assert.Equal(t, append(append([]Status(nil), want...), StatusMissing), got, "a new key of shard %d", si)
		assert.EqualValues(t, 1, handOns, "a new key of shard %d", si)
		assert.EqualValues(t, 1, ops, "a new key of shard %d", si)
	}

	// A prefix lookup: after a miss the caches need not hold the keys,
	// which are skipped, whichever shard the miss is on.
	for l := range tr.shards {
		keys := append([]int{0, 1}, idx[2:]...)
		for k := 2; k < len(keys); k++ {
			keys[k] = newKey(k % 2)
		}
		got, handOns, ops = ask(l, true, keys)
		assert.Equal(t, []Status{StatusFound, StatusMissing}, got[:2], "lead %d", l)
		for k, st := range got[2:] {
			assert.Equal(t, StatusSkipped, st, "lead %d, key %d", l, k+2)
		}
		assert.Zero(t, handOns, "lead %d", l)
		assert.Zero(t, ops, "lead %d", l)
	}
}

// TestLeadsAtClose: a large lookup whose lead dispatches it after Close
// stopped the other owner, or abandons it at Close's deadline before it
// dispatched it, still ends with one Result, the other shard's keys
// canceled.
func TestLeadsAtClose(t *testing.T) {
	n := 2 * ownersHashKeys
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	var handed atomic.Int32
	handedOn = func(*request, *shard) { handed.Add(1) }
	t.Cleanup(func() { handedOn = nil })

	t.Run("the other owner gone", func(t *testing.T) {
		arrived, release := make(chan *shard, 1), make(chan struct{})
		leadDispatching = func(s *shard) {
			arrived <- s
			<-release
		}
		t.Cleanup(func() { leadDispatching = nil })
		tr, shardOf, _ := leadTier(t)
		handed.Store(0)
		require.NoError(t, tr.Lookup(1, testKeys(idx...)))
		l := <-arrived
		closed := make(chan error, 1)
		go func() { closed <- tr.Close(context.Background()) }()
		other := tr.shards[1-l.idx]
		select {
		case <-other.exited:
		case <-time.After(20 * time.Second):
			t.Fatal("the other owner did not exit")
		}
		close(release)
		require.NoError(t, <-closed)
		assert.EqualValues(t, 1, handed.Load(), "handed on to the owner gone")
		res := await(t, tr, 1)[1]
		for i, k := range res.Keys {
			if shardOf(i) == other.idx {
				assert.Equal(t, StatusCanceled, k.Status, "key %d", i)
			} else {
				assert.NotEqual(t, StatusPending, k.Status, "key %d", i)
			}
		}
	})

	t.Run("abandoned", func(t *testing.T) {
		blocked, release := make(chan *shard, 1), make(chan struct{})
		var armed atomic.Bool
		armed.Store(true)
		opStarted = func(s *shard) {
			if armed.CompareAndSwap(true, false) {
				blocked <- s
				<-release
			}
		}
		t.Cleanup(func() { opStarted = nil })
		tr, _, lead := leadTier(t)
		handed.Store(0)
		require.NoError(t, tr.Lookup(1, testKeys(0)))
		busy := <-blocked // in the middle of its pass: the next lookup waits in its inbox
		lead(busy.idx)
		require.NoError(t, tr.Lookup(2, testKeys(idx...)))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		closed := make(chan error, 1)
		go func() { closed <- tr.Close(ctx) }()
		require.Eventually(t, func() bool {
			busy.mu.Lock()
			defer busy.mu.Unlock()
			return busy.abandon
		}, 20*time.Second, time.Millisecond, "Close gave up")
		close(release)
		<-closed
		assert.EqualValues(t, 1, handed.Load(), "handed on at the abandon")
		res := await(t, tr, 2)[2]
		assert.Len(t, res.Keys, n)
		for i, k := range res.Keys {
			assert.Equal(t, StatusCanceled, k.Status, "key %d", i)
		}
	})
}
