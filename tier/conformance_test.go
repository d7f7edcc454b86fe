package tier

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/linux_test/noring"
	"github.com/uringtier/uringtier/uring"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	// In a child started by noring.Run (TestConformanceWithoutIOURing), io_uring must be off before any test runs.
	if err := noring.InstallFilterFromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	goleak.VerifyTestMain(m)
}

const testBlockSize = 8192

// forEachEngine runs the test against every engine: the conformance suite.
// In a child without io_uring (noring) only the sync engine can run.
func forEachEngine(t *testing.T, f func(t *testing.T, kind EngineKind)) {
	kinds := []EngineKind{EngineURing, EngineSync}
	if _, ok := noring.InChild(); ok {
		// A child without io_uring (TestConformanceWithoutIOURing) runs
		// the suite on the fallback only.
		kinds = []EngineKind{EngineSync}
	}
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) { f(t, kind) })
	}
}

// testNoDirect, when set (by judgeAllAside), makes openTier's tiers load
// and store through the page cache; testStoresOnRing (TestStoresOnRing)
// keeps their io_uring engine's stores on the rings; testAligned
// (TestStoresWriteOnRing) has testPayload return memory aligned for
// O_DIRECT, whose stores the io_uring engine's pool writes on its ring.
var testNoDirect, testStoresOnRing, testAligned bool

func openTier(t testing.TB, kind EngineKind, dir string, mod func(*Options)) *Tier {
	t.Helper()
	// No lookup cache unless a test asks for one (TestLookupCache, the
	// model): most tests change the tree behind the tier's back.
	opts := Options{BlockSize: testBlockSize, Engine: kind, Rings: 2, OpsMax: 64, LookupCacheTTL: -1, NoDirect: testNoDirect, StoresOnRing: testStoresOnRing}
	if mod != nil {
		mod(&opts)
	}
	tr, err := Open(dir, opts)
	require.NoError(t, err)
	require.Equal(t, kind, tr.Engine().Kind)
	if kind == EngineURing {
		// t.TempDir is on ext4 or tmpfs on every machine we test on.
		require.True(t, tr.Engine().Inline, "filesystem %s", tr.Engine().FS)
		require.Equal(t, !opts.StoresOnRing, tr.Engine().StoresSync, "stores on the store pool")
		require.Equal(t, testLoadsSync || tr.Engine().FS == "tmpfs", tr.Engine().LoadsSync, "loads on the store pool")
	}
	t.Cleanup(func() {
		tr.Close(context.Background())
		for _, s := range tr.shards {
			// Every load key dealt to a shard was answered, once.
			assert.Zero(t, s.loadKeys.Load(), "shard %d: load keys dealt and not answered", s.idx)
		}
	})
	return tr
}

func testKey(i int) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	h := sha256.Sum256(b[:])
	return h[:]
}

func testKeys(idx ...int) [][]byte {
	keys := make([][]byte, len(idx))
	for j, i := range idx {
		keys[j] = testKey(i)
	}
	return keys
}

func testPayload(i int) []byte {
	p := make([]byte, testBlockSize)
	if testAligned {
		p = alignedBytes(testBlockSize)
	}
	rng := rand.New(rand.NewPCG(uint64(i), 7))
	for k := range p {
		p[k] = byte(rng.Uint32())
	}
	return p
}

// put writes blocks through the synchronous store, the oracle.
func put(t testing.TB, tr *Tier, idx ...int) {
	t.Helper()
	for _, i := range idx {
		require.NoError(t, tr.BlockStore().Put(tr.Namespace(), testKey(i), testPayload(i)))
	}
}

// await polls until the requests in want have all reported, and returns
// their Results by request ID. A second Result for a request fails.
func await(t testing.TB, tr *Tier, want ...uint64) map[uint64]Result {
	t.Helper()
	return awaitWithin(t, tr, 20*time.Second, want...)
}

// awaitWithin is await, failing after d instead of 20 s.
func awaitWithin(t testing.TB, tr *Tier, d time.Duration, want ...uint64) map[uint64]Result {
	t.Helper()
	got := map[uint64]Result{}
	buf := make([]Result, 8)
	deadline := time.After(d)
	for len(got) < len(want) {
		select {
		case <-tr.Ready():
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			require.FailNow(t, "timed out", "have %d of %d results", len(got), len(want))
		}
		for {
			n := tr.Poll(buf)
			if n == 0 {
				break
			}
			for _, r := range buf[:n] {
				_, dup := got[r.Req]
				require.False(t, dup, "two results for request %d", r.Req)
				r.Keys = append([]KeyResult(nil), r.Keys...)
				got[r.Req] = r
			}
		}
	}
	return got
}

func statuses(r Result) []Status {
	s := make([]Status, len(r.Keys))
	for i, k := range r.Keys {
		s[i] = k.Status
	}
	return s
}

func TestLookupHitMissPrefix(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, lk := range []LookupOp{LookupStatx, LookupMixed, LookupOpenPath} {
			t.Run("lookup="+lk.String(), func(t *testing.T) { testLookupHitMissPrefix(t, kind, lk) })
		}
	})
}

func testLookupHitMissPrefix(t *testing.T, kind EngineKind, lk LookupOp) {
	tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Lookup = lk })
	put(t, tr, 0, 1, 2, 4)
	require.NoError(t, tr.Lookup(1, testKeys(0, 1, 2, 3, 4)))
	require.NoError(t, tr.Lookup(2, testKeys(9)))
	require.NoError(t, tr.Lookup(3, nil))
	got := await(t, tr, 1, 2, 3)
	r := got[1]
	assert.Equal(t, OpLookup, r.Op)
	assert.Equal(t, []Status{StatusFound, StatusFound, StatusFound, StatusMissing, StatusFound}, statuses(r))
	assert.Equal(t, 3, r.Prefix)
	assert.Equal(t, []Status{StatusMissing}, statuses(got[2]))
	assert.Equal(t, 0, got[2].Prefix)
	assert.Empty(t, got[3].Keys)
}

// TestLookupColdDentries: with the dentry cache dropped, an O_PATH lookup
// cannot resolve from it (RESOLVE_CACHED fails EAGAIN) and asks STATX
// instead; the answers are the same as warm, and nothing fails.
func TestLookupColdDentries(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, lk := range []LookupOp{LookupStatx, LookupMixed, LookupOpenPath} {
			t.Run("lookup="+lk.String(), func(t *testing.T) {
				tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Lookup, o.LookupCacheTTL = lk, -1 })
				var keys [][]byte
				var want []Status
				for i := range 64 {
					keys = append(keys, testKey(i))
					want = append(want, StatusMissing)
					if i%2 == 0 {
						put(t, tr, i)
						want[i] = StatusFound
					}
				}
				unix.Sync()
				if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2\n"), 0); err != nil {
					t.Skipf("cannot drop the dentry cache: %v", err)
				}
				require.NoError(t, tr.Lookup(1, keys))
				assert.Equal(t, want, statuses(await(t, tr, 1)[1]))
			})
		}
	})
}

func TestLookupPrefixSkips(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		// One ring and one op: keys go one at a time, so everything after
		// the miss is skipped, deterministically.
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Rings, o.OpsMax = 1, 1 })
		put(t, tr, 0, 1, 3, 4)
		require.NoError(t, tr.LookupPrefix(1, testKeys(0, 1, 2, 3, 4)))
		r := await(t, tr, 1)[1]
		assert.Equal(t, []Status{StatusFound, StatusFound, StatusMissing, StatusSkipped, StatusSkipped}, statuses(r))
		assert.Equal(t, 2, r.Prefix)
	})
}

func TestDuplicateAndSharedKeys(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Rings = 1 })
		put(t, tr, 1)
		for req := uint64(1); req <= 4; req++ {
			require.NoError(t, tr.Lookup(req, testKeys(1, 1, 2, 1, 2)))
		}
		got := await(t, tr, 1, 2, 3, 4)
		for req := uint64(1); req <= 4; req++ {
			assert.Equal(t, []Status{StatusFound, StatusFound, StatusMissing, StatusFound, StatusMissing}, statuses(got[req]))
		}
		st := tr.Stats()
		assert.Equal(t, uint64(20), st.Keys[OpLookup])
		assert.Positive(t, st.Shared, "no key shared an op")
		ops := uint64(0)
		for _, n := range st.Latency[OpLookup] {
			ops += n
		}
		assert.Equal(t, uint64(20), ops+st.Shared, "every key is an op or shares one")
	})
}

func TestLookupCache(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Hour })
		put(t, tr, 1)
		require.NoError(t, tr.Lookup(1, testKeys(1, 2)))
		await(t, tr, 1)
		// Behind the tier's back: the cache still answers.
		require.NoError(t, tr.BlockStore().Delete(tr.Namespace(), testKey(1)))
		put(t, tr, 2)
		require.NoError(t, tr.Lookup(2, testKeys(1, 2)))
		assert.Equal(t, []Status{StatusFound, StatusMissing}, statuses(await(t, tr, 2)[2]))
		assert.Equal(t, uint64(2), tr.Stats().CacheHits)
		// A stale hit is safe: a load never uses the cache, reports the
		// vanished block missing, and the cache learns it.
		buf := make([]byte, testBlockSize)
		require.NoError(t, tr.Load(10, testKeys(1), [][]byte{buf}))
		assert.Equal(t, []Status{StatusMissing}, statuses(await(t, tr, 10)[10]))
		require.NoError(t, tr.Lookup(11, testKeys(1)))
		assert.Equal(t, []Status{StatusMissing}, statuses(await(t, tr, 11)[11]))
		assert.Equal(t, uint64(3), tr.Stats().CacheHits)

		tr.InvalidateLookups()
		require.NoError(t, tr.Lookup(3, testKeys(1, 2)))
		assert.Equal(t, []Status{StatusMissing, StatusFound}, statuses(await(t, tr, 3)[3]))

		// The tier's own store updates the cache at once; a second store is
		// answered "present" from it.
		buf = testPayload(5)
		require.NoError(t, tr.Store(4, testKeys(5), [][]byte{buf}))
		assert.Equal(t, []Status{StatusStored}, statuses(await(t, tr, 4)[4]))
		hits := tr.Stats().CacheHits
		require.NoError(t, tr.Lookup(5, testKeys(5)))
		assert.Equal(t, []Status{StatusFound}, statuses(await(t, tr, 5)[5]))
		require.NoError(t, tr.Store(6, testKeys(5), [][]byte{buf}))
		assert.Equal(t, []Status{StatusPresent}, statuses(await(t, tr, 6)[6]))
		assert.Equal(t, hits+2, tr.Stats().CacheHits)
	})
}

// countAnsweredInCall counts the lookups answered in the caller's call
// until the test ends.
func countAnsweredInCall(t *testing.T) *atomic.Int32 {
	var n atomic.Int32
	answeredInCall = func(*request) { n.Add(1) }
	t.Cleanup(func() { answeredInCall = nil })
	return &n
}

// TestLookupsAnsweredInCall: a small lookup whose every key the cache
// holds, fresh, is answered in the caller's call, its Result ready for the
// next Poll, with what an owner would have answered; the tier's own
// stores, deletes and loads reach it first, and InvalidateLookups, a TTL
// passed, a large batch or one key not there leave it to the owners.
func TestLookupsAnsweredInCall(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		inCall := countAnsweredInCall(t)
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Hour })
		req := uint64(0)
		// ask looks idx up and says what came back and whether the
		// call answered it, in which case Poll has it at once.
		ask := func(prefix bool, idx ...int) ([]Status, bool) {
			t.Helper()
			req++
			n := inCall.Load()
			submit := tr.Lookup
			if prefix {
				submit = tr.LookupPrefix
			}
			require.NoError(t, submit(req, testKeys(idx...)))
			if inCall.Load() == n {
				return statuses(await(t, tr, req)[req]), false
			}
			res := make([]Result, 2)
			require.Equal(t, 1, tr.Poll(res), "answered in the call, ready at once")
			require.Equal(t, req, res[0].Req)
			return statuses(res[0]), true
		}
		started := func() (n uint64) {
			for _, s := range tr.shards {
				n += s.started.Load()
			}
			return n
		}

		put(t, tr, 1)
		got, in := ask(false, 1, 2, 3)
		assert.False(t, in, "the cache starts empty")
		want := []Status{StatusFound, StatusMissing, StatusMissing}
		assert.Equal(t, want, got)
		hits, ops := tr.Stats().CacheHits, started()
		got, in = ask(false, 1, 2, 3)
		assert.True(t, in)
		assert.Equal(t, want, got)
		assert.Equal(t, hits+3, tr.Stats().CacheHits)
		assert.Equal(t, ops, started(), "no owner started an op")
		outcomes := tr.Stats().Outcomes[OpLookup]
		assert.Equal(t, uint64(2), outcomes[StatusFound], "counted like an owner's answers")
		assert.Equal(t, uint64(4), outcomes[StatusMissing])

		// Prefix-only: the keys after the first miss are skipped, also
		// ones never looked up, whatever their shards.
		got, in = ask(true, 1, 2, 3)
		assert.True(t, in)
		assert.Equal(t, []Status{StatusFound, StatusMissing, StatusSkipped}, got)
		got, in = ask(true, 1, 2, 50, 51, 52, 53, 54, 55, 56, 57)
		assert.True(t, in, "keys after the miss never looked up")
		assert.Equal(t, append([]Status{StatusFound, StatusMissing}, slices.Repeat([]Status{StatusSkipped}, 8)...), got)

		// Caches that their owners hold: the call does not wait for
		// them, and leaves the lookup to the owners, which read their
		// own without the lock.
		for _, s := range tr.shards {
			s.cacheMu.Lock()
		}
		n := inCall.Load()
		req++
		called := make(chan error, 1)
		go func(req uint64) { called <- tr.Lookup(req, testKeys(1, 2, 3)) }(req)
		var err error
		waited := false
		select {
		case err = <-called:
		case <-time.After(10 * time.Second):
			waited = true
		}
		for _, s := range tr.shards {
			s.cacheMu.Unlock()
		}
		require.False(t, waited, "the call waits for an owner's cache")
		require.NoError(t, err)
		assert.Equal(t, n, inCall.Load(), "answered in the call under the owners' locks")
		assert.Equal(t, want, statuses(await(t, tr, req)[req]))

		// The tier's own store and delete are in the cache before their
		// Results are.
		require.NoError(t, tr.Store(100, testKeys(2), [][]byte{testPayload(2)}))
		assert.Equal(t, []Status{StatusStored}, statuses(await(t, tr, 100)[100]))
		require.NoError(t, tr.Delete(101, testKeys(1)))
		assert.Equal(t, []Status{StatusDeleted}, statuses(await(t, tr, 101)[101]))
		got, in = ask(false, 1, 2, 3)
		assert.True(t, in)
		assert.Equal(t, []Status{StatusMissing, StatusFound, StatusMissing}, got)

		// A load that finds a block gone behind the tier's back: a lookup
		// after its Result says missing, also where the load ran on
		// another shard than the key's, whose news waits for the key's
		// owner to take it in. Loads go to the shards in turn and keys by
		// a hash seeded at Open: with two shards each key's load runs
		// elsewhere with odds of one half, and for none of 24 keys to do
		// so has odds of 2^-24.
		idx := make([]int, 24)
		for k := range idx {
			idx[k] = 10 + k
		}
		put(t, tr, idx...)
		got, _ = ask(false, idx...)
		require.Equal(t, slices.Repeat([]Status{StatusFound}, len(idx)), got)
		elsewhere := 0
		for _, i := range idx {
			require.NoError(t, tr.BlockStore().Delete(tr.Namespace(), testKey(i)))
			req++
			require.NoError(t, tr.Load(req, testKeys(i), [][]byte{make([]byte, testBlockSize)}))
			require.Equal(t, []Status{StatusMissing}, statuses(await(t, tr, req)[req]))
			home := tr.shards[shardOfHash(maphash.Bytes(tr.seed, testKey(i)), len(tr.shards))]
			if home.learnedN.Load() > 0 {
				elsewhere++
			}
			got, _ = ask(false, i)
			assert.Equal(t, []Status{StatusMissing}, got, "key %d", i)
		}
		if len(tr.shards) > 1 {
			assert.Positive(t, elsewhere, "a load on another shard than its key's")
		}

		tr.InvalidateLookups()
		_, in = ask(false, 2)
		assert.False(t, in, "after InvalidateLookups")
		_, in = ask(false, 2)
		assert.True(t, in)
		_, in = ask(false, 2, 99)
		assert.False(t, in, "a key not in the cache")
		large := make([]int, ownersHashKeys)
		for i := range large {
			large[i] = 1000 + i
		}
		ask(false, large...)
		_, in = ask(false, large...)
		assert.False(t, in, "a batch the owners hash")
		_, in = ask(false, large[:ownersHashKeys-1]...)
		assert.True(t, in, "one key fewer")
		if kind == EngineURing {
			// More rings than the owners hash for: the caller hashes a
			// large batch too, and still leaves it to the owners.
			tr = openTier(t, kind, t.TempDir(), func(o *Options) {
				o.LookupCacheTTL, o.Rings = time.Hour, ownersHashShards+1
			})
			require.False(t, ownersHash(ownersHashKeys, len(tr.shards)))
			ask(false, large...)
			_, in = ask(false, large...)
			assert.False(t, in, "a large batch on %d rings", len(tr.shards))
		}

		// A TTL passed: the owners ask the filesystem again.
		tr = openTier(t, kind, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Second })
		put(t, tr, 1)
		ask(false, 1)
		_, in = ask(false, 1)
		assert.True(t, in)
		time.Sleep(1100 * time.Millisecond)
		got, in = ask(false, 1)
		assert.False(t, in, "past the TTL")
		assert.Equal(t, []Status{StatusFound}, got)
	})
}

// TestLookupsInCallWhileOwnersWrite: lookups answered in the call while
// the owners write their caches (stores, deletes and lookups of other keys
// completing), for the race detector, and each answer right.
func TestLookupsInCallWhileOwnersWrite(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		inCall := countAnsweredInCall(t)
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Hour })
		// Small batches of the cached keys, answered in the call, and
		// large ones, which one owner answers from every cache (io_uring:
		// shard.dispatchLeads).
		var all []int
		var want []Status
		for i := range ownersHashKeys {
			all, want = append(all, i), append(want, StatusMissing)
			if i%2 == 0 {
				put(t, tr, i)
				want[i] = StatusFound
			}
		}
		require.NoError(t, tr.Lookup(1, testKeys(all...)))
		await(t, tr, 1)
		cached := [][][]byte{testKeys(all[:8]...), testKeys(all...)}
		req := uint64(1)
		results := make([]Result, 8)
		for round := range 50 {
			// Work for the owners whose outcomes they write to their
			// caches, in flight while the caller asks.
			busy := make([]int, 16)
			for i := range busy {
				busy[i] = 1000 + round*16 + i
			}
			bufs := make([][]byte, len(busy))
			for i := range bufs {
				bufs[i] = testPayload(busy[i])
			}
			req++
			store := req
			require.NoError(t, tr.Store(store, testKeys(busy...), bufs))
			req++
			lookup := req
			require.NoError(t, tr.Lookup(lookup, testKeys(slices.Concat(busy, []int{2000 + round})...)))
			pending := map[uint64]bool{store: true, lookup: true}
			large := uint64(0) // one large lookup in flight at a time
			for len(pending) > 0 {
				req++
				keys := cached[0]
				if !pending[large] {
					keys, large = cached[1], req
				}
				// A small one finds a cache's lock held now and then and
				// goes to the owners: the depth may fill.
				switch err := tr.Lookup(req, keys); {
				case errors.Is(err, ErrBusy):
					<-tr.Ready()
				default:
					require.NoError(t, err)
					pending[req] = true
				}
				for _, r := range results[:tr.Poll(results)] {
					if r.Req != store && r.Req != lookup {
						require.Equal(t, want[:len(r.Keys)], statuses(r), "request %d", r.Req)
					}
					delete(pending, r.Req)
				}
			}
		}
		assert.Positive(t, inCall.Load(), "lookups answered in the call")
		if len(tr.shards) > 1 {
			assert.Greater(t, tr.leads.Load(), uint32(1), "large lookups led")
		}
	})
}

// TestOwnersHashLargeBatches: the keys of a large batch, which the owners
// hash (ownersHash), reach the same shard and cache entry as those of small
// batches, which the caller hashes, both ways, lookups and loads alike.
func TestOwnersHashLargeBatches(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Hour })
		require.True(t, ownersHash(ownersHashKeys, len(tr.shards)))
		require.False(t, ownersHash(ownersHashKeys-1, len(tr.shards)))
		const small = 16
		var idx, evens []int
		var want []Status
		for i := range ownersHashKeys {
			idx, want = append(idx, i), append(want, StatusMissing)
			if i%2 == 0 {
				evens, want[i] = append(evens, i), StatusFound
			}
		}
		// lookup asks about every key in batches of n and says how many
		// the cache answered.
		req := uint64(0)
		lookup := func(n int) uint64 {
			t.Helper()
			hits := tr.Stats().CacheHits
			var got []Status
			for k := 0; k < len(idx); k += n {
				req++
				require.NoError(t, tr.Lookup(req, testKeys(idx[k:k+n]...)))
				got = append(got, statuses(await(t, tr, req)[req])...)
			}
			require.Equal(t, want, got)
			return tr.Stats().CacheHits - hits
		}
		// Behind the tier's back: only the cache can still say found.
		forget := func() {
			t.Helper()
			for _, i := range evens {
				require.NoError(t, tr.BlockStore().Delete(tr.Namespace(), testKey(i)))
			}
		}

		put(t, tr, evens...)
		assert.Zero(t, lookup(small), "the cache starts empty")
		forget()
		assert.Equal(t, uint64(ownersHashKeys), lookup(ownersHashKeys), "what small batches learned, a large one finds")
		// The large batch's request slot kept no hashes of the caller's.
		// Where more than one owner takes it, its keys are hashed once,
		// chunk by chunk: by its lead (a lookup with the cache on,
		// shard.dispatchLeads), else shared between its owners (startPass).
		hashedOnce := func(tr *Tier) {
			t.Helper()
			tr.mu.Lock()
			defer tr.mu.Unlock()
			large := 0
			for i := range tr.reqs {
				if r := &tr.reqs[i]; r.n() == ownersHashKeys && len(r.hashes) == 0 {
					large++
					if len(tr.shards) > 1 {
						assert.Len(t, r.chunks, ownersHashKeys/hashChunk)
					} else {
						assert.Empty(t, r.chunks)
					}
					for c := range r.chunks {
						assert.EqualValues(t, chunkHashed, r.chunks[c].Load(), "chunk %d", c)
					}
				}
			}
			assert.Equal(t, 1, large, "a slot of the large batch without the caller's hashes")
		}
		hashedOnce(tr)
		noCache := openTier(t, kind, t.TempDir(), nil)
		require.NoError(t, noCache.Lookup(1, testKeys(idx...)))
		await(t, noCache, 1)
		hashedOnce(noCache)
		tr.InvalidateLookups()
		put(t, tr, evens...)
		assert.Zero(t, lookup(ownersHashKeys))
		forget()
		assert.Equal(t, uint64(ownersHashKeys), lookup(small), "what a large batch learned, small ones find")

		// A large load teaches the cache too, on the key's own shard.
		tr.InvalidateLookups()
		put(t, tr, evens...)
		bufs := make([][]byte, len(idx))
		for i := range bufs {
			bufs[i] = make([]byte, testBlockSize)
		}
		req++
		require.NoError(t, tr.Load(req, testKeys(idx...), bufs))
		got := statuses(await(t, tr, req)[req])
		for i := range idx {
			if i%2 == 0 {
				assert.Equal(t, StatusLoaded, got[i], "key %d", i)
				assert.Equal(t, testPayload(i), bufs[i], "block %d", i)
			} else {
				assert.Equal(t, StatusMissing, got[i], "key %d", i)
			}
		}
		forget()
		assert.Equal(t, uint64(ownersHashKeys), lookup(small), "what a large load learned, small lookups find")

		// A large load of other keys in the request slot that a large
		// lookup's owners just hashed into (hashChunks) hashes its own keys.
		tr.InvalidateLookups()
		put(t, tr, evens...)
		lookup(ownersHashKeys)
		for k := range idx {
			idx[k] += ownersHashKeys
		}
		for k := range evens {
			evens[k] += ownersHashKeys
		}
		put(t, tr, evens...)
		req++
		require.NoError(t, tr.Load(req, testKeys(idx...), bufs))
		assert.Equal(t, got, statuses(await(t, tr, req)[req]))
		forget()
		assert.Equal(t, uint64(ownersHashKeys), lookup(small), "what a large load in a large lookup's slot learned, small lookups find")
	})
}

func TestLoad(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Buffers = 2 })
		put(t, tr, 0, 1, 2)
		bufs := [][]byte{make([]byte, testBlockSize), tr.Buffers()[0], make([]byte, testBlockSize), tr.Buffers()[1]}
		require.NoError(t, tr.Load(1, testKeys(0, 1, 3, 2), bufs))
		r := await(t, tr, 1)[1]
		assert.Equal(t, []Status{StatusLoaded, StatusLoaded, StatusMissing, StatusLoaded}, statuses(r))
		assert.Equal(t, 2, r.Prefix)
		assert.Equal(t, testPayload(0), bufs[0])
		assert.Equal(t, testPayload(1), bufs[1])
		assert.Equal(t, testPayload(2), bufs[3])
	})
}

func blockFile(tr *Tier, i int) string {
	rel := tr.BlockStore().Layout().AppendPath(nil, testKey(i))
	return filepath.Join(tr.nsDir, string(rel))
}

// TestLoadCorrupt loads damaged blocks into the caller's buffers and into
// the tier's (which the io_uring engine reads with O_DIRECT whole, header,
// payload and past the end, into each buffer's frame).
func TestLoadCorrupt(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		t.Run("caller-buffers", func(t *testing.T) { testLoadCorrupt(t, kind, false) })
		t.Run("tier-buffers", func(t *testing.T) { testLoadCorrupt(t, kind, true) })
	})
}

func testLoadCorrupt(t *testing.T, kind EngineKind, tierBuffers bool) {
	tr := openTier(t, kind, t.TempDir(), func(o *Options) {
		if tierBuffers {
			o.Buffers = 6
		}
	})
	put(t, tr, 0, 1, 2, 3, 4, 6)
	// 0: a payload byte flipped; 1: truncated; 2: a header byte
	// flipped; 3: shorter than its header; 4: another key's block;
	// 6 (loaded as the sixth key): one byte appended.
	flip := func(path string, off int64) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		b := []byte{0}
		_, err = f.ReadAt(b, off)
		require.NoError(t, err)
		b[0] ^= 0x40
		_, err = f.WriteAt(b, off)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	flip(blockFile(tr, 0), blockstore.HeaderSize+100)
	require.NoError(t, os.Truncate(blockFile(tr, 1), blockstore.HeaderSize+10))
	flip(blockFile(tr, 2), 20)
	require.NoError(t, os.Truncate(blockFile(tr, 3), 100))
	require.NoError(t, os.Rename(blockFile(tr, 4), blockFile(tr, 0)+".x"))
	put(t, tr, 5)
	require.NoError(t, os.Rename(blockFile(tr, 5), blockFile(tr, 4)))
	require.NoError(t, os.Remove(blockFile(tr, 0)+".x"))
	f, err := os.OpenFile(blockFile(tr, 6), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte{0})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	// The one rule: blockstore.Get calls each of them corrupt too.
	for _, i := range []int{0, 1, 2, 3, 4, 6} {
		_, err := tr.BlockStore().Get(tr.Namespace(), testKey(i), make([]byte, testBlockSize))
		require.ErrorIs(t, err, blockstore.ErrCorrupt, "Get of block %d", i)
	}

	bufs := make([][]byte, 6)
	for i := range bufs {
		bufs[i] = make([]byte, testBlockSize)
	}
	if tierBuffers {
		bufs = tr.Buffers()
	}
	require.NoError(t, tr.Load(1, testKeys(0, 1, 2, 3, 4, 6), bufs))
	r := await(t, tr, 1)[1]
	for i, k := range r.Keys {
		assert.Equal(t, StatusCorrupt, k.Status, "key %d", i)
		assert.ErrorIs(t, k.Err, blockstore.ErrCorrupt, "key %d", i)
	}
	const fileSize = blockstore.HeaderSize + testBlockSize
	assert.Contains(t, r.Keys[0].Err.Error(), "checksum")
	assert.Contains(t, r.Keys[1].Err.Error(), fmt.Sprintf("file is %d bytes, header says %d", blockstore.HeaderSize+10, fileSize))
	assert.Contains(t, r.Keys[3].Err.Error(), "shorter than")
	assert.Contains(t, r.Keys[5].Err.Error(), fmt.Sprintf("file is %d bytes, header says %d", fileSize+1, fileSize))
	if e := tr.Engine(); tierBuffers && e.Kind == EngineURing && e.Direct && e.Inline && !e.LoadsSync {
		// Read in one piece: block 0's header (its payload is the
		// damaged part) lies in front of buffer 0.
		h, err := blockstore.DecodeHeader(tr.frames[0][:blockstore.HeaderSize])
		require.NoError(t, err)
		assert.Equal(t, testKey(0), h.Key)
	}
	// Quarantined: the next lookup misses, and the files are kept aside.
	require.NoError(t, tr.Lookup(2, testKeys(0, 1, 2, 3, 4, 6)))
	assert.Equal(t, []Status{StatusMissing, StatusMissing, StatusMissing, StatusMissing, StatusMissing, StatusMissing}, statuses(await(t, tr, 2)[2]))
	q, err := os.ReadDir(tr.qDir)
	require.NoError(t, err)
	assert.Len(t, q, 6)
}

// TestLoadOneBufferTwice: a caller that gives one of the tier's buffers to
// two loads at once breaks Load's rule, and gets what two reads into one
// buffer give; but no load judges the other's header, which the io_uring
// engine reads into the buffer's frame: here both blocks hold the same
// payload, and both load whole, every time (without the frame's flag,
// one of them found the other's header in most of these tries).
func TestLoadOneBufferTwice(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Buffers, o.Rings = 1, 1 })
		payload := testPayload(7)
		for i := range 2 {
			require.NoError(t, tr.BlockStore().Put(tr.Namespace(), testKey(i), payload))
		}
		buf := tr.Buffers()[0]
		for try := range 20 {
			clear(buf)
			require.NoError(t, tr.Load(uint64(try), testKeys(0, 1), [][]byte{buf, buf}))
			r := await(t, tr, uint64(try))[uint64(try)]
			for i, k := range r.Keys {
				require.Equal(t, StatusLoaded, k.Status, "try %d, key %d: %v", try, i, k.Err)
			}
			require.Equal(t, payload, buf)
		}
	})
}

// TestBuffersOfAGiB: a tier's buffers of 1 GiB and more are too large for
// the kernel to register with their frames (IORING_REGISTER_BUFFERS fails
// with EFAULT over 1 GiB a buffer): the tier opens with them unregistered,
// and a lookup through it answers.
func TestBuffersOfAGiB(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, size := range []int{1 << 30, 1<<30 + 4096} {
			tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.BlockSize, o.Buffers = size, 1 })
			require.Len(t, tr.Buffers(), 1)
			assert.Len(t, tr.Buffers()[0], size)
			require.NoError(t, tr.Lookup(1, testKeys(0)))
			assert.Equal(t, []Status{StatusMissing}, statuses(await(t, tr, 1)[1]))
			require.NoError(t, tr.Close(context.Background()))
		}
	})
}

// TestBuffersInHugePages: buffers of 1 MiB, whose frames lie across the
// 2 MiB huge pages that back them (uring.AllocBuffer), store and load
// every byte right, loads into other buffers than the stores came from,
// every frame's header in place (the io_uring engine's O_DIRECT loads).
func TestBuffersInHugePages(t *testing.T) {
	const size, n = 1 << 20, 6
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.BlockSize, o.Buffers = size, n })
		bufs := tr.Buffers()
		want := make([][]byte, n)
		for i := range n {
			want[i] = make([]byte, size)
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			for k := range want[i] {
				want[i][k] = byte(rng.Uint32())
			}
			copy(bufs[i], want[i])
		}
		keys := testKeys(0, 1, 2, 3, 4, 5)
		require.NoError(t, tr.Store(1, keys, bufs))
		assert.Equal(t, []Status{StatusStored, StatusStored, StatusStored, StatusStored, StatusStored, StatusStored}, statuses(await(t, tr, 1)[1]))
		for i := range bufs {
			clear(bufs[i])
		}
		// Block i into buffer (i+1) mod n.
		require.NoError(t, tr.Load(2, keys, append(append([][]byte(nil), bufs[1:]...), bufs[0])))
		assert.Equal(t, []Status{StatusLoaded, StatusLoaded, StatusLoaded, StatusLoaded, StatusLoaded, StatusLoaded}, statuses(await(t, tr, 2)[2]))
		framed := tr.Engine().Kind == EngineURing && tr.Engine().Direct && !tr.Engine().LoadsSync
		for i := range n {
			j := (i + 1) % n
			assert.True(t, bytes.Equal(want[i], bufs[j]), "block %d in buffer %d", i, j)
			if framed {
				h, err := blockstore.DecodeHeader(tr.frames[j][:blockstore.HeaderSize])
				require.NoError(t, err, "frame %d", j)
				assert.Equal(t, keys[i], h.Key, "frame %d", j)
			}
		}
	})
}

// TestBufferMemory: buffers laid out in the caller's memory
// (Options.BufferMemory) store and load as the tier's own do, a load's
// header landing in that memory in front of the buffer (the io_uring
// engine's O_DIRECT loads, one READ_FIXED), and Close leaves the memory
// mapped, the caller's.
func TestBufferMemory(t *testing.T) {
	size := BuffersSize(testBlockSize, 2)
	require.Equal(t, 2*bufferStride(testBlockSize), size)
	mem, err := uring.AllocBuffer(size + blockstore.HeaderSize)
	require.NoError(t, err)
	t.Cleanup(func() { uring.FreeBuffer(mem) })
	for _, c := range []struct {
		buffers int
		mem     []byte
		want    string
	}{
		{0, mem[:size], "BufferMemory without Buffers"},
		{2, mem[:size-1], fmt.Sprintf("BufferMemory of %d bytes for Buffers 2 of BlockSize %d (want BuffersSize: %d)", size-1, testBlockSize, size)},
		{2, mem[1 : size+1], "want a 4 KiB boundary"},
	} {
		_, err := Open(t.TempDir(), Options{BlockSize: testBlockSize, Buffers: c.buffers, BufferMemory: c.mem})
		require.ErrorIs(t, err, ErrInvalidOptions)
		assert.Contains(t, err.Error(), c.want)
	}
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		mem, err := uring.AllocBuffer(size) // a whole mapping: one the tier could unmap
		require.NoError(t, err)
		t.Cleanup(func() { uring.FreeBuffer(mem) })
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Buffers, o.BufferMemory = 2, mem })
		bufs := tr.Buffers()
		stride := bufferStride(testBlockSize)
		for i, b := range bufs {
			require.Len(t, b, testBlockSize)
			require.Same(t, &mem[i*stride+blockstore.HeaderSize], &b[0], "buffer %d", i)
		}
		copy(bufs[0], testPayload(3))
		require.NoError(t, tr.Store(1, testKeys(3), bufs[:1]))
		require.Equal(t, StatusStored, await(t, tr, 1)[1].Keys[0].Status)
		require.NoError(t, tr.Load(2, testKeys(3), bufs[1:]))
		require.Equal(t, StatusLoaded, await(t, tr, 2)[2].Keys[0].Status)
		assert.Equal(t, testPayload(3), bufs[1])
		if e := tr.Engine(); e.Kind == EngineURing && e.Direct && e.Inline && !e.LoadsSync {
			h, err := blockstore.DecodeHeader(mem[stride : stride+blockstore.HeaderSize])
			require.NoError(t, err, "the header in front of buffer 1")
			assert.Equal(t, testKey(3), h.Key)
		}
		require.NoError(t, tr.Close(context.Background()))
		assert.Nil(t, tr.Buffers())
		assert.Equal(t, testPayload(3), mem[stride+blockstore.HeaderSize:stride+blockstore.HeaderSize+testBlockSize], "the memory, still mapped, is the caller's")

		// Memory longer than the buffers: a slice past them, where a third
		// buffer would start, is the caller's memory like any other (it
		// once indexed past the registered frames).
		long, err := uring.AllocBuffer(size + stride)
		require.NoError(t, err)
		t.Cleanup(func() { uring.FreeBuffer(long) })
		tr = openTier(t, kind, t.TempDir(), func(o *Options) { o.Buffers, o.BufferMemory = 2, long })
		past := long[2*stride+blockstore.HeaderSize : 2*stride+blockstore.HeaderSize+testBlockSize]
		copy(past, testPayload(4))
		require.NoError(t, tr.Store(3, testKeys(4), [][]byte{past}))
		require.Equal(t, StatusStored, await(t, tr, 3)[3].Keys[0].Status)
		clear(past)
		require.NoError(t, tr.Load(4, testKeys(4), [][]byte{past}))
		k := await(t, tr, 4)[4].Keys[0]
		require.Equal(t, StatusLoaded, k.Status, "%v", k.Err)
		assert.Equal(t, testPayload(4), past)
	})
	t.Run("file-backed", func(t *testing.T) {
		// A mapping of a file on disk, which io_uring does not register:
		// refused at Open, saying what memory to give. Not in tmpfs, whose
		// files' pages it does register: the first of these on a disk.
		var f *os.File
		for _, dir := range []string{t.TempDir(), "/var/tmp", "."} {
			var st unix.Statfs_t
			if unix.Statfs(dir, &st) == nil && st.Type != unix.TMPFS_MAGIC {
				var err error
				f, err = os.CreateTemp(dir, "uringtier-mem")
				require.NoError(t, err)
				break
			}
		}
		require.NotNil(t, f, "a directory on a disk")
		defer os.Remove(f.Name())
		defer f.Close()
		require.NoError(t, f.Truncate(int64(size)))
		fmem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		require.NoError(t, err)
		defer unix.Munmap(fmem)
		if uring.Available() == nil { // not in TestConformanceWithoutIOURing's child
			_, err = Open(t.TempDir(), Options{BlockSize: testBlockSize, Engine: EngineURing, Buffers: 2, BufferMemory: fmem})
			require.ErrorIs(t, err, ErrInvalidOptions)
			assert.Contains(t, err.Error(), "BufferMemory is memory the kernel does not register")
		}
		tr, err := Open(t.TempDir(), Options{BlockSize: testBlockSize, Engine: EngineSync, Buffers: 2, BufferMemory: fmem})
		require.NoError(t, err, "the sync engine registers nothing")
		require.NoError(t, tr.Close(context.Background()))
	})
}

// TestLoadOtherBlockSize: a block stored whole at another block size is
// someone else's, not damaged: a load reports it corrupt and leaves it, the
// larger one too, whose end the reads past the block never reach.
func TestLoadOtherBlockSize(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		dir := t.TempDir()
		const bigSize = 8 * testBlockSize
		big := openTier(t, kind, dir, func(o *Options) { o.BlockSize = bigSize })
		small := openTier(t, kind, dir, nil)
		require.NoError(t, big.BlockStore().Put(big.Namespace(), testKey(0), bytes.Repeat([]byte{7}, bigSize)))
		put(t, small, 1)
		for _, c := range []struct {
			tr        *Tier
			key, size int
		}{{small, 0, bigSize}, {big, 1, testBlockSize}} {
			require.NoError(t, c.tr.Load(1, testKeys(c.key), [][]byte{make([]byte, c.tr.opts.BlockSize)}))
			k := await(t, c.tr, 1)[1].Keys[0]
			require.Equal(t, StatusCorrupt, k.Status, "key %d: %v", c.key, k.Err)
			assert.ErrorIs(t, k.Err, blockstore.ErrCorrupt)
			assert.Contains(t, k.Err.Error(), fmt.Sprintf("payload is %d bytes, the block size is %d", c.size, c.tr.opts.BlockSize))
			_, err := os.Stat(blockFile(small, c.key))
			assert.NoError(t, err, "key %d left in place", c.key)
		}
		q, err := os.ReadDir(small.qDir)
		if !errors.Is(err, fs.ErrNotExist) {
			require.NoError(t, err)
		}
		assert.Empty(t, q, "nothing quarantined")
	})
}

func TestStore(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, d := range []blockstore.Durability{blockstore.DurabilityNone, blockstore.DurabilityData, blockstore.DurabilityFull} {
			t.Run(d.String(), func(t *testing.T) {
				tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Durability = d; o.Buffers = 1 })
				b0, b1 := testPayload(0), tr.Buffers()[0]
				copy(b1, testPayload(1))
				require.NoError(t, tr.Store(1, testKeys(0, 1), [][]byte{b0, b1}))
				assert.Equal(t, []Status{StatusStored, StatusStored}, statuses(await(t, tr, 1)[1]))
				for i := range 2 {
					buf := make([]byte, testBlockSize)
					n, err := tr.BlockStore().Get(tr.Namespace(), testKey(i), buf)
					require.NoError(t, err)
					assert.Equal(t, testBlockSize, n)
					assert.Equal(t, testPayload(i), buf)
				}
				// Storing again overwrites with the same content (no cache here).
				require.NoError(t, tr.Store(2, testKeys(0), [][]byte{b0}))
				assert.Equal(t, []Status{StatusStored}, statuses(await(t, tr, 2)[2]))
				assertNoTempFiles(t, tr)
			})
		}
	})
}

// TestDelete removes blocks: each key ends deleted, or missing when there
// was no block; later lookups and loads miss, also through the lookup
// cache, which learns the delete.
func TestDelete(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Hour })
		put(t, tr, 0, 1, 2)
		require.NoError(t, tr.Lookup(1, testKeys(0, 1, 2)))
		require.Equal(t, []Status{StatusFound, StatusFound, StatusFound}, statuses(await(t, tr, 1)[1]))
		require.NoError(t, tr.Delete(2, testKeys(0, 1, 9)))
		res := await(t, tr, 2)[2]
		assert.Equal(t, OpDelete, res.Op)
		assert.Equal(t, []Status{StatusDeleted, StatusDeleted, StatusMissing}, statuses(res))
		assert.Equal(t, 2, res.Prefix, "deleted keys are successes")
		for i, want := range []bool{false, false, true} {
			ok, err := tr.BlockStore().Has(tr.Namespace(), testKey(i))
			require.NoError(t, err)
			assert.Equal(t, want, ok, "block %d on disk", i)
		}
		require.NoError(t, tr.Lookup(3, testKeys(0, 1, 2)))
		assert.Equal(t, []Status{StatusMissing, StatusMissing, StatusFound}, statuses(await(t, tr, 3)[3]), "the cache learned the delete")
		require.NoError(t, tr.Load(4, testKeys(0), [][]byte{make([]byte, testBlockSize)}))
		assert.Equal(t, []Status{StatusMissing}, statuses(await(t, tr, 4)[4]))
		st := tr.Stats()
		assert.Equal(t, uint64(2), st.Outcomes[OpDelete][StatusDeleted])
		assert.Equal(t, uint64(1), st.Outcomes[OpDelete][StatusMissing])
		require.ErrorIs(t, tr.Delete(5, [][]byte{[]byte("short")}), ErrInvalid)
	})
}

func assertNoTempFiles(t *testing.T, tr *Tier) {
	t.Helper()
	layout := tr.BlockStore().Layout()
	filepath.WalkDir(tr.nsDir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(tr.nsDir, path)
		assert.False(t, layout.IsTempPath(rel), "temporary file left: %s", rel)
		return nil
	})
}

// TestStoreFromBuffers stores from every one of the tier's buffers, whose
// block size is no multiple of 4 KiB, and from one buffer under two keys
// in the same request, with each durability: every block reads back
// whole, and no store wrote into any buffer. (A header written into room
// in front of its buffer, tried once for the io_uring engine, would break
// the two keys of one buffer: each store has a header of its own.)
func TestStoreFromBuffers(t *testing.T) {
	const size = 5000
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, d := range []blockstore.Durability{blockstore.DurabilityNone, blockstore.DurabilityFull} {
			t.Run(d.String(), func(t *testing.T) {
				tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Durability = d; o.Buffers = 3; o.BlockSize = size })
				bufs := tr.Buffers()
				want := make([][]byte, len(bufs))
				for k, b := range bufs {
					for j := range b {
						b[j] = byte(k*7 + j)
					}
					want[k] = slices.Clone(b)
				}
				// Key 3 is buffer 1 again.
				require.NoError(t, tr.Store(1, testKeys(0, 1, 2, 3), append(bufs[:3:3], bufs[1])))
				assert.Equal(t, []Status{StatusStored, StatusStored, StatusStored, StatusStored}, statuses(await(t, tr, 1)[1]))
				for i, k := range []int{0, 1, 2, 1} {
					assert.Equal(t, want[k], bufs[k], "buffer %d", k)
					got := make([]byte, size)
					n, err := tr.BlockStore().Get(tr.Namespace(), testKey(i), got)
					require.NoError(t, err, "block %d", i)
					assert.Equal(t, want[k], got[:n], "block %d", i)
				}
			})
		}
	})
}

func TestStoreDirectoryVanished(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), nil)
		buf := testPayload(0)
		require.NoError(t, tr.Store(1, testKeys(0), [][]byte{buf}))
		assert.Equal(t, []Status{StatusStored}, statuses(await(t, tr, 1)[1]))
		// Remove the fan-out directories under the tier, then store again.
		entries, err := os.ReadDir(tr.nsDir)
		require.NoError(t, err)
		for _, e := range entries {
			require.NoError(t, os.RemoveAll(filepath.Join(tr.nsDir, e.Name())))
		}
		require.NoError(t, tr.Store(2, testKeys(0), [][]byte{buf}))
		assert.Equal(t, []Status{StatusStored}, statuses(await(t, tr, 2)[2]))
		ok, err := tr.BlockStore().Has(tr.Namespace(), testKey(0))
		require.NoError(t, err)
		assert.True(t, ok)
	})
}

func TestBadInput(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.BatchMax = 4 })
		buf := make([]byte, testBlockSize)
		cases := []struct {
			name string
			err  error
		}{
			{"short key", tr.Lookup(1, [][]byte{[]byte("short")})},
			{"long key", tr.Lookup(1, [][]byte{make([]byte, 65)})},
			{"nil key", tr.Lookup(1, [][]byte{nil})},
			{"too many keys", tr.Lookup(1, testKeys(1, 2, 3, 4, 5))},
			{"small buffer", tr.Load(1, testKeys(1), [][]byte{buf[:100]})},
			{"large buffer", tr.Store(1, testKeys(1), [][]byte{append(buf, 0)})},
			{"buffer count", tr.Load(1, testKeys(1, 2), [][]byte{buf})},
		}
		for _, c := range cases {
			assert.ErrorIs(t, c.err, ErrInvalid, c.name)
		}
		assert.ErrorIs(t, cases[0].err, blockstore.ErrInvalidKey)
		// Nothing was queued by the refused calls: request 1 is free.
		require.NoError(t, tr.Lookup(1, testKeys(1)))
		assert.ErrorIs(t, tr.Lookup(1, testKeys(2)), ErrInvalid, "request ID in flight")
		await(t, tr, 1)
		require.NoError(t, tr.Lookup(1, testKeys(2)), "the ID is free again after Poll")
		await(t, tr, 1)
	})
}

func TestOpenRejectsBadOptions(t *testing.T) {
	type bad struct {
		name string
		opts Options
		want []string // what the error must say: the option, its value, its bound
	}
	cases := []bad{
		{"no BlockSize", Options{}, []string{"BlockSize 0"}},
		{"negative BlockSize", Options{BlockSize: -1}, []string{"BlockSize -1"}},
		{"Namespace", Options{BlockSize: 4096, Namespace: "../x"}, []string{"namespace"}},
		{"negative Depth", Options{BlockSize: 4096, Depth: -1}, []string{"Depth -1"}},
		{"negative LookupTimeout", Options{BlockSize: 4096, LookupTimeout: -time.Second}, []string{"duration"}},
		{"Durability", Options{BlockSize: 4096, Durability: 7}, []string{"Durability 7"}},
		{"Buffers×BlockSize", Options{BlockSize: 1 << 30, Buffers: 1 << 10},
			[]string{"Buffers 1024 of BlockSize 1073741824", fmt.Sprint(buffersSizeBound)}},
		{"negative Capacity", Options{BlockSize: 4096, Capacity: -1}, []string{"Capacity -1"}},
		{"CapacityShare above 1", Options{BlockSize: 4096, CapacityShare: 1.5}, []string{"CapacityShare 1.5"}},
		{"CapacityShare NaN", Options{BlockSize: 4096, CapacityShare: math.NaN()}, []string{"CapacityShare NaN"}},
		{"both capacities", Options{BlockSize: 4096, Capacity: 1 << 30, CapacityShare: 0.5}, []string{"one of"}},
		{"low above high", Options{BlockSize: 4096, HighWatermark: 0.5, LowWatermark: 0.6}, []string{"low 0.6, high 0.5"}},
		{"high above 1", Options{BlockSize: 4096, HighWatermark: 1.1}, []string{"high 1.1"}},
		{"watermark NaN", Options{BlockSize: 4096, LowWatermark: math.NaN()}, []string{"low NaN"}},
		{"negative EvictInterval", Options{BlockSize: 4096, EvictInterval: -time.Second}, []string{"duration"}},
	}
	limits := []struct {
		name  string
		set   func(o *Options, v int)
		bound int
	}{
		{"Depth", func(o *Options, v int) { o.Depth = v }, depthBound},
		{"BatchMax", func(o *Options, v int) { o.BatchMax = v }, batchMaxBound},
		{"LookupCacheSize", func(o *Options, v int) { o.LookupCacheSize = v }, lookupCacheSizeBound},
		{"Rings", func(o *Options, v int) { o.Rings = v }, ringsBound},
		{"OpsMax", func(o *Options, v int) { o.OpsMax = v }, opsMaxBound},
		{"WorkersMax", func(o *Options, v int) { o.WorkersMax = v }, workersMaxBound},
		{"SyncWorkers", func(o *Options, v int) { o.SyncWorkers = v }, syncWorkersBound},
		{"BreakerThreshold", func(o *Options, v int) { o.BreakerThreshold = v }, breakerThresholdBound},
		{"Buffers", func(o *Options, v int) { o.Buffers = v }, buffersBound},
	}
	for _, l := range limits {
		for _, v := range []int{l.bound + 1, 1 << 50, math.MaxInt} {
			o := Options{BlockSize: 4096}
			l.set(&o, v)
			want := []string{fmt.Sprintf("%s %d", l.name, v), fmt.Sprintf("to %d", l.bound)}
			cases = append(cases, bad{fmt.Sprintf("%s=%d", l.name, v), o, want})
		}
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var tr *Tier
			var err error
			require.NotPanics(t, func() { tr, err = Open(dir, c.opts) })
			if tr != nil {
				tr.Close(context.Background())
			}
			require.ErrorIs(t, err, ErrInvalidOptions)
			for _, w := range c.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
	t.Setenv(EngineEnv, "bogus")
	_, err := Open(dir, Options{BlockSize: 4096})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

func TestEngineEnvOverridesAuto(t *testing.T) {
	for _, kind := range []EngineKind{EngineSync, EngineURing} {
		t.Setenv(EngineEnv, kind.String())
		tr, err := Open(t.TempDir(), Options{BlockSize: 4096})
		require.NoError(t, err)
		assert.Equal(t, kind, tr.Engine().Kind)
		assert.Empty(t, tr.Engine().Fallback)
		// The flags are those the owners' rings were granted: every ring
		// asks for CQSIZE; the sync engine has none.
		if kind == EngineURing {
			assert.Contains(t, tr.Engine().Flags, "CQSIZE")
		} else {
			assert.Empty(t, tr.Engine().Flags)
		}
		require.NoError(t, tr.Close(context.Background()))
	}
}

func TestBusyAtDepth(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Depth = 2 })
		require.NoError(t, tr.Lookup(1, testKeys(1)))
		require.NoError(t, tr.Lookup(2, testKeys(2)))
		assert.ErrorIs(t, tr.Lookup(3, testKeys(3)), ErrBusy)
		assert.Equal(t, uint64(1), tr.Stats().Busy)
		await(t, tr, 1, 2)
		require.NoError(t, tr.Lookup(3, testKeys(3)))
		await(t, tr, 3)
	})
}

func TestCancel(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		// One ring and one op: keys run one at a time, in submit order, so
		// request 9 waits behind 4 × 4,096 lookups (tens of milliseconds)
		// and the Cancel lands before any of its keys has started.
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Rings, o.OpsMax = 1, 1 })
		put(t, tr, 0)
		ahead := make([][]byte, 4096)
		for i := range ahead {
			ahead[i] = testKey(i % 3)
		}
		for req := uint64(1); req <= 4; req++ {
			require.NoError(t, tr.Lookup(req, ahead))
		}
		require.NoError(t, tr.Lookup(9, testKeys(0, 1, 2)))
		require.True(t, tr.Cancel(9))
		got := await(t, tr, 1, 2, 3, 4, 9)
		for i, k := range got[9].Keys {
			assert.Equal(t, StatusCanceled, k.Status, "key %d", i)
			assert.ErrorIs(t, k.Err, ErrCanceled, "key %d", i)
		}
		assert.Zero(t, got[9].Prefix)
		for req := uint64(1); req <= 4; req++ {
			for i, k := range got[req].Keys {
				want := map[bool]Status{true: StatusFound, false: StatusMissing}[i%3 == 0]
				require.Equal(t, want, k.Status, "request %d key %d", req, i)
			}
		}
		assert.False(t, tr.Cancel(9), "already finished")
		assert.False(t, tr.Cancel(99), "never submitted")
	})
}

func TestCloseWithWorkInFlight(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		dir := t.TempDir()
		tr, err := Open(dir, Options{BlockSize: testBlockSize, Engine: kind, OpsMax: 4, NoDirect: testNoDirect, StoresOnRing: testStoresOnRing})
		require.NoError(t, err)
		put(t, tr, 0)
		buf := testPayload(1)
		var reqs []uint64
		for req := uint64(1); req <= 20; req++ {
			if req%2 == 0 {
				require.NoError(t, tr.Store(req, testKeys(int(req)+100), [][]byte{buf}))
			} else {
				require.NoError(t, tr.Lookup(req, testKeys(0, 1, 2, 3)))
			}
			reqs = append(reqs, req)
		}
		require.NoError(t, tr.Close(context.Background()))
		got := await(t, tr, reqs...)
		for _, r := range got {
			for _, k := range r.Keys {
				assert.Contains(t, []Status{StatusFound, StatusMissing, StatusStored, StatusCanceled}, k.Status, "%v: %v", r.Op, k.Err)
			}
		}
		assert.Zero(t, tr.Poll(make([]Result, 4)), "more results than requests")
		assert.ErrorIs(t, tr.Lookup(99, testKeys(0)), ErrClosed)
		assert.ErrorIs(t, tr.Load(99, testKeys(0), [][]byte{buf}), ErrClosed)
		assert.ErrorIs(t, tr.Store(99, testKeys(0), [][]byte{buf}), ErrClosed)
		assert.NoError(t, tr.Close(context.Background()), "second Close")
		assertNoTempFiles(t, tr)
	})
}

// TestModel drives each engine with random lookups, loads, stores and
// deletes, checking every outcome against the synchronous store.
func TestModel(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, seed))
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.LookupCacheTTL = time.Duration(rng.IntN(2)) * time.Hour })
		oracle := tr.BlockStore()
		ns := tr.Namespace()
		const keySpace = 24
		for step := range 300 {
			n := 1 + rng.IntN(6)
			idx := make([]int, n)
			for j := range idx {
				idx[j] = rng.IntN(keySpace)
			}
			keys := testKeys(idx...)
			req := uint64(step)
			switch rng.IntN(4) {
			case 0:
				require.NoError(t, tr.Lookup(req, keys))
				r := await(t, tr, req)[req]
				for j, i := range idx {
					has, err := oracle.Has(ns, testKey(i))
					require.NoError(t, err)
					want := map[bool]Status{true: StatusFound, false: StatusMissing}[has]
					require.Equal(t, want, r.Keys[j].Status, "seed %d step %d key %d", seed, step, i)
				}
			case 1:
				bufs := make([][]byte, n)
				for j := range bufs {
					bufs[j] = make([]byte, testBlockSize)
				}
				require.NoError(t, tr.Load(req, keys, bufs))
				r := await(t, tr, req)[req]
				for j, i := range idx {
					want := make([]byte, testBlockSize)
					_, err := oracle.Get(ns, testKey(i), want)
					if errors.Is(err, fs.ErrNotExist) {
						require.Equal(t, StatusMissing, r.Keys[j].Status, "seed %d step %d", seed, step)
						continue
					}
					require.NoError(t, err)
					require.Equal(t, StatusLoaded, r.Keys[j].Status, "seed %d step %d", seed, step)
					require.True(t, bytes.Equal(want, bufs[j]), "seed %d step %d: payload", seed, step)
				}
			case 2:
				bufs := make([][]byte, n)
				for j, i := range idx {
					bufs[j] = testPayload(i)
				}
				require.NoError(t, tr.Store(req, keys, bufs))
				r := await(t, tr, req)[req]
				for j := range idx {
					require.True(t, r.Keys[j].Status.OK(), "seed %d step %d: %v %v", seed, step, r.Keys[j].Status, r.Keys[j].Err)
				}
			case 3:
				for _, i := range idx {
					err := oracle.Delete(ns, testKey(i))
					if err != nil && !errors.Is(err, fs.ErrNotExist) {
						require.NoError(t, err)
					}
				}
				tr.InvalidateLookups()
			}
		}
	})
}

func TestSubmitPollDoesNotAllocate(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), nil)
		put(t, tr, 0, 2, 4, 6)
		keys := testKeys(0, 1, 2, 3, 4, 5, 6, 7)
		results := make([]Result, 4)
		round := func() {
			if err := tr.Lookup(1, keys); err != nil {
				panic(err)
			}
			for tr.Poll(results) == 0 {
				<-tr.Ready()
			}
		}
		for range 50 {
			round() // warm up: request slots, maps and result slices grow once
		}
		allocs := testing.AllocsPerRun(200, round)
		assert.Zero(t, allocs, "allocations per request of %d keys", len(keys))
	})
}

func ExampleTier() {
	dir, _ := os.MkdirTemp("", "tier-example")
	defer os.RemoveAll(dir)
	tr, err := Open(dir, Options{BlockSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tr.Close(context.Background())
	key := bytes.Repeat([]byte{7}, 32)
	block := bytes.Repeat([]byte("kv"), 2048)
	_ = tr.Store(1, [][]byte{key}, [][]byte{block})
	results := make([]Result, 1)
	for tr.Poll(results) == 0 {
		<-tr.Ready()
	}
	_ = tr.Lookup(2, [][]byte{key, bytes.Repeat([]byte{8}, 32)})
	for tr.Poll(results) == 0 {
		<-tr.Ready()
	}
	fmt.Println(results[0].Keys[0].Status, results[0].Keys[1].Status, "prefix", results[0].Prefix)
	// Output: found missing prefix 1
}

// TestOpenFailsCleanly makes the io_uring engine's set-up fail half-way (a
// fixed-file table larger than RLIMIT_NOFILE): Open returns the error and
// leaves no goroutine or ring behind (goleak checks at exit).
func TestOpenFailsCleanly(t *testing.T) {
	lowerNoFile(t)
	tr, err := Open(t.TempDir(), Options{BlockSize: testBlockSize, Engine: EngineURing, OpsMax: 4096})
	require.Error(t, err)
	assert.Nil(t, tr)
	assert.Contains(t, err.Error(), "IORING_REGISTER_FILES2")
}
