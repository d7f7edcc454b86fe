package linux_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

// Shared-filesystem semantics: two clients of one GlusterFS volume (two glusterfs client processes,
// each with its own caches, talking to one brick over TCP) stand for two inference hosts.

// glusterStaleMax is the staleness bound the shared tests set: the lookup cache's TTL on the
// reading side. With client caching on, the FUSE client adds its own entry and attribute cache
// (1 s by default) on top.
const glusterStaleMax = 300 * time.Millisecond

// TestGlusterSharedBlocks stores through client A and reads through client B, for each engine and
// with the clients' caches off and on: B's lookups and loads before the staleness bound see each
// block either whole or not at all, and once the bound has passed since the stores were polled, B
// finds every block and loads it byte-exact; a store from B of a block it has found is
// StatusPresent without a write.
func TestGlusterSharedBlocks(t *testing.T) {
	for _, caching := range []glusterCaching{glusterCacheOff, glusterCacheOn} {
		t.Run(map[glusterCaching]string{glusterCacheOff: "cache=off", glusterCacheOn: "cache=on"}[caching], func(t *testing.T) {
			g := newGluster(t, 2, caching)
			bound := glusterStaleMax
			if caching == glusterCacheOn {
				bound += time.Second // the FUSE client's entry-timeout and attribute-timeout
			}
			engines(t, func(t *testing.T, kind tier.EngineKind) {
				ns := "shared-" + kind.String() // the engines share the volume
				a := openTier(t, kind, g.Mounts[0], func(o *tier.Options) { o.Namespace = ns })
				b := openTier(t, kind, g.Mounts[1], func(o *tier.Options) { o.Namespace, o.LookupCacheTTL = ns, glusterStaleMax })
				require.Equal(t, "fuse", a.Engine().FS)
				const n = 16
				// B asks first, so that its caches (ours and the client's) hold the misses.
				require.NoError(t, b.Lookup(1, keyRange(0, n)))
				for i, s := range statuses(await(t, b, 1)[1]) {
					require.Equal(t, tier.StatusMissing, s, "key %d before any store", i)
				}

				bufs := make([][]byte, n)
				for i := range bufs {
					bufs[i] = payload(i, blockSize)
				}
				require.NoError(t, a.Store(1, keyRange(0, n), bufs))
				for i, k := range await(t, a, 1)[1].Keys {
					require.Equal(t, tier.StatusStored, k.Status, "A's store of key %d: %v", i, k.Err)
				}
				stored := time.Now()

				// Before the bound: whole or absent, never anything else.
				require.NoError(t, b.Lookup(2, keyRange(0, n)))
				early := buffers(n, blockSize)
				require.NoError(t, b.Load(3, keyRange(0, n), early))
				got := await(t, b, 2, 3)
				for i, k := range got[2].Keys {
					require.Contains(t, []tier.Status{tier.StatusFound, tier.StatusMissing}, k.Status, "B's early lookup of key %d: %v", i, k.Err)
				}
				loadedEarly := 0
				for i, k := range got[3].Keys {
					switch k.Status {
					case tier.StatusLoaded:
						require.Equal(t, bufs[i], early[i], "B's early load of key %d", i)
						loadedEarly++
					case tier.StatusMissing:
					default:
						t.Fatalf("B's early load of key %d: %v %v", i, k.Status, k.Err)
					}
				}

				// After the bound: everything, byte-exact.
				time.Sleep(time.Until(stored.Add(bound)))
				require.NoError(t, b.Lookup(4, keyRange(0, n)))
				for i, s := range statuses(await(t, b, 4)[4]) {
					require.Equal(t, tier.StatusFound, s, "B's lookup of key %d %v after A stored it", i, bound)
				}
				late := buffers(n, blockSize)
				require.NoError(t, b.Load(5, keyRange(0, n), late))
				for i, k := range await(t, b, 5)[5].Keys {
					require.Equal(t, tier.StatusLoaded, k.Status, "B's load of key %d: %v", i, k.Err)
					require.Equal(t, bufs[i], late[i], "B's load of key %d", i)
				}
				require.NoError(t, b.Store(6, keys(0), [][]byte{bufs[0]}))
				require.Equal(t, []tier.Status{tier.StatusPresent}, statuses(await(t, b, 6)[6]), "B stores a block it has found")
				t.Logf("%s, %s: %d of %d blocks loaded through B before the bound, all after it", kind, a.Engine().FS, loadedEarly, n)
				verifyClean(t, b.BlockStore(), b.Namespace(), "through B")
			})
		})
	}
}

// TestGlusterConcurrentStores has clients A and B store the same keys at once, A one content and B
// another, round after round, while both load them: every store succeeds, every load is one of the
// two contents, whole, or a miss; afterwards no visible block is corrupt and no temporary file is
// left. One failure is GlusterFS's own: when both clients make the same new directory at once, the
// brick may fail to set the directory's gfid ("setting gfid on … failed [File exists]" in its log)
// and one client cannot open the directory for a while, after its MKDIR said it is there; that
// store (retried once by the tier) then fails with ENOENT naming the directory (newDirRace). Seen
// in 1 of 12 runs, on both engines; the same key's store in a later round succeeds.
func TestGlusterConcurrentStores(t *testing.T) {
	g := newGluster(t, 2, glusterCacheOff)
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		seed := uint64(time.Now().UnixNano())
		ns := "concurrent-" + kind.String()
		mod := func(o *tier.Options) { o.Namespace = ns }
		trs := []*tier.Tier{openTier(t, kind, g.Mounts[0], mod), openTier(t, kind, g.Mounts[1], mod)}
		const n, rounds = 24, 6
		// content c of key i: A stores c = 0, B stores c = 1.
		content := func(c, i int) []byte { return payload(1000*c+i, blockSize) }
		var mu sync.Mutex
		counts := map[string]int{}
		var wg sync.WaitGroup
		for c, tr := range trs {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed, uint64(c)))
				results := make([]tier.Result, 4)
				for round := range rounds {
					idx := rng.Perm(n)
					bufs := make([][]byte, n)
					for j, i := range idx {
						bufs[j] = content(c, i)
					}
					req := uint64(2 * round)
					if !assert.NoError(t, tr.Store(req, keys(idx...), bufs)) {
						return
					}
					r, err := pollOne(tr, req, results)
					if !assert.NoError(t, err) {
						return
					}
					for j, k := range r.Keys {
						if newDirRace(tr, idx[j], k) {
							mu.Lock()
							counts["store: new directory not there"]++
							mu.Unlock()
							continue
						}
						assert.True(t, k.Status.OK(), "seed %d client %d: store of key %d: %v %v", seed, c, idx[j], k.Status, k.Err)
					}
					lbufs := buffers(n, blockSize)
					if !assert.NoError(t, tr.Load(req+1, keys(idx...), lbufs)) {
						return
					}
					r, err = pollOne(tr, req+1, results)
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					for j, k := range r.Keys {
						i := idx[j]
						switch {
						case k.Status == tier.StatusLoaded && bytes.Equal(lbufs[j], content(0, i)):
							counts["loaded A's"]++
						case k.Status == tier.StatusLoaded && bytes.Equal(lbufs[j], content(1, i)):
							counts["loaded B's"]++
						case k.Status == tier.StatusMissing:
							counts["missing"]++
						default:
							assert.Fail(t, "a torn or wrong block", "seed %d client %d: load of key %d: %v %v", seed, c, i, k.Status, k.Err)
						}
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		t.Logf("seed %d: %v", seed, counts)
		require.Positive(t, counts["loaded A's"]+counts["loaded B's"], "nothing loaded")
		store := trs[1].BlockStore()
		vs := verifyClean(t, store, ns, fmt.Sprintf("seed %d", seed))
		assert.Equal(t, int64(n), vs.Blocks, "every key is one whole block")
		assert.Empty(t, tempFiles(t, store, ns), "temporary files")
	})
}

// newDirRace reports whether k, the result of tr's store of key i, failed because a directory the
// store makes for the block could not be opened right after it was made (ENOENT naming the block's
// directory or one above it, not the block or its temporary file): GlusterFS's race of two clients
// making one directory, above.
func newDirRace(tr *tier.Tier, i int, k tier.KeyResult) bool {
	var pe *fs.PathError
	if k.Status != tier.StatusFailed || !errors.As(k.Err, &pe) || !errors.Is(pe.Err, syscall.ENOENT) {
		return false
	}
	store := tr.BlockStore()
	ns, err := store.NamespaceDir(tr.Namespace())
	if err != nil {
		return false
	}
	dir := filepath.Join(ns, string(store.Layout().AppendDir(nil, key(i))))
	return pe.Path != ns && (pe.Path == dir || strings.HasPrefix(dir, pe.Path+"/"))
}

// TestGlusterKilledWriter SIGKILLs a process storing through client A, again and again until a kill
// has landed mid-store: B sees no visible block that is not whole. Then B's Clean, run while a live
// writer stores through A, removes exactly the dead writers' temporary files once they are older
// than its threshold, and none of the live writer's: every live store succeeds.
func TestGlusterKilledWriter(t *testing.T) {
	const kills, killsMax = 3, 24
	g := newGluster(t, 2, glusterCacheOff)
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		seed := uint64(time.Now().UnixNano())
		rng := rand.New(rand.NewPCG(seed, 5))
		// The crash child stores into the "default" namespace of its directory: one per engine.
		dirA := filepath.Join(g.Mounts[0], kind.String())
		dirB := filepath.Join(g.Mounts[1], kind.String())
		require.NoError(t, os.Mkdir(dirA, 0o755))
		storeB, err := blockstore.Open(dirB, blockstore.Options{})
		require.NoError(t, err)
		const ns = "default"
		n := killStoringChildren(t, killPlan{kills, killsMax, 200 * time.Millisecond, true}, dirA, kind, rng, seed, storeB, ns)
		dead := tempFiles(t, storeB, ns)
		require.NotEmpty(t, dead, "seed %d: no kill of %d landed mid-store", seed, n)
		vs := verifyClean(t, storeB, ns, fmt.Sprintf("seed %d, through B", seed))
		require.Positive(t, vs.Blocks, "seed %d: no block was published", seed)

		// The dead writers' files are fresh: Clean with a threshold leaves them, as it would a live
		// writer's. Aged past it (as time would), they go.
		const olderThan = 10 * time.Minute
		cs, err := storeB.Clean(olderThan)
		require.NoError(t, err)
		require.Zero(t, cs.Removed, "seed %d: Clean removed fresh temporary files", seed)
		nsDir, err := storeB.NamespaceDir(ns)
		require.NoError(t, err)
		old := time.Now().Add(-2 * olderThan)
		for _, rel := range dead {
			require.NoError(t, os.Chtimes(filepath.Join(nsDir, rel), old, old))
		}

		// A live writer stores through A while B cleans, many times over.
		live := openTier(t, kind, dirA, func(o *tier.Options) { o.BlockSize = crashBlockSize })
		stop := make(chan struct{})
		var removed int64
		var cleans int
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				cs, err := storeB.Clean(olderThan)
				if !assert.NoError(t, err) {
					return
				}
				removed += cs.Removed
				cleans++
			}
		})
		liveStored := 0
		bufs := make([][]byte, 16)
		for req := range uint64(8) {
			idx := make([]int, len(bufs))
			for j := range idx {
				idx[j] = 1<<20 + int(req)*len(bufs) + j // keys no child stored
				bufs[j] = payload(idx[j], crashBlockSize)
			}
			require.NoError(t, live.Store(req, keys(idx...), bufs))
			for j, k := range await(t, live, req)[req].Keys {
				require.Equal(t, tier.StatusStored, k.Status, "seed %d: the live writer's store of key %d: %v", seed, idx[j], k.Err)
				liveStored++
			}
		}
		close(stop)
		wg.Wait()
		require.Positive(t, cleans, "Clean never ran")
		assert.Equal(t, int64(len(dead)), removed, "seed %d: Clean from B removed the dead writers' files and only those", seed)
		assert.Empty(t, tempFiles(t, storeB, ns), "seed %d: temporary files after Clean", seed)
		vs = verifyClean(t, storeB, ns, fmt.Sprintf("seed %d, after Clean", seed))
		t.Logf("seed %d: %d kills left %d temporary files; B's %d Cleans removed them while %d live stores went through; %d blocks",
			seed, n, len(dead), cleans, liveStored, vs.Blocks)
	})
}

// glusterTimeout is every key's deadline in the server-gone test.
const glusterTimeout = 500 * time.Millisecond

// TestGlusterServerGone takes the brick away under two clients' tiers, for each engine. Hung
// (SIGSTOP): every key of lookups, loads and stores ends at its deadline StatusTimedOut with
// ErrTimeout, the breaker opens, and Close of B returns by its context with ErrStuck. Continued:
// A's breaker closes after a probe and A looks up, loads and stores again without a restart.
// Killed (SIGKILL): every key fails at once with an *fs.PathError wrapping ENOTCONN (the client
// has lost its connection); once the volume is started again, A works again.
func TestGlusterServerGone(t *testing.T) {
	g := newGluster(t, 2, glusterCacheOff)
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		const threshold = 4
		ns := "gone-" + kind.String()
		mod := func(o *tier.Options) {
			o.Namespace = ns
			o.Rings, o.OpsMax = 1, 64 // one shard: one breaker
			o.LookupTimeout, o.IOTimeout = glusterTimeout, glusterTimeout
			o.BreakerThreshold = threshold
		}
		a := openTier(t, kind, g.Mounts[0], mod)
		b := openTier(t, kind, g.Mounts[1], mod)
		const n = 16
		for i := range n {
			require.NoError(t, a.BlockStore().Put(ns, key(i), payload(i, blockSize)))
		}
		// submitAll submits lookups, loads and stores on tr and returns the Results.
		submitAll := func(tr *tier.Tier, base uint64) map[uint64]tier.Result {
			t.Helper()
			timedCall(t, "Lookup", func() error { return tr.Lookup(base, keyRange(0, 8)) })
			timedCall(t, "Load", func() error { return tr.Load(base+1, keyRange(8, 12), buffers(4, blockSize)) })
			sbufs := [][]byte{payload(100, blockSize), payload(101, blockSize), payload(102, blockSize), payload(103, blockSize)}
			timedCall(t, "Store", func() error { return tr.Store(base+2, keyRange(100, 104), sbufs) })
			got, _ := hungResults(t, tr, base, base+1, base+2)
			return got
		}
		// worksAgain waits for tr to find, load and store again: its first key is the breaker's
		// probe, if it is open.
		worksAgain := func(tr *tier.Tier, base uint64) {
			t.Helper()
			req := base
			require.Eventually(t, func() bool {
				req++
				require.NoError(t, tr.Lookup(req, keyRange(0, n)))
				for _, s := range statuses(await(t, tr, req)[req]) {
					if s != tier.StatusFound {
						return false
					}
				}
				return true
			}, 60*time.Second, 100*time.Millisecond, "the tier did not recover (breaker open: %v)", tr.Stats().BreakerOpen)
			assert.False(t, tr.Stats().BreakerOpen, "the breaker is open after lookups succeeded")
			lbufs := buffers(n, blockSize)
			require.NoError(t, tr.Load(req+1, keyRange(0, n), lbufs))
			for i, k := range await(t, tr, req+1)[req+1].Keys {
				require.Equal(t, tier.StatusLoaded, k.Status, "load of key %d after recovery: %v", i, k.Err)
				require.Equal(t, payload(i, blockSize), lbufs[i], "load of key %d after recovery", i)
			}
			require.NoError(t, tr.Store(req+2, keys(200+int(base)), [][]byte{payload(200+int(base), blockSize)}))
			require.Equal(t, []tier.Status{tier.StatusStored}, statuses(await(t, tr, req+2)[req+2]), "store after recovery")
		}

		// Hung: the brick stops answering.
		brick := g.BrickPid(t)
		require.NoError(t, syscall.Kill(brick, syscall.SIGSTOP))
		continued := false
		defer func() {
			if !continued {
				syscall.Kill(brick, syscall.SIGCONT)
			}
		}()
		for name, tr := range map[string]*tier.Tier{"A": a, "B": b} {
			for req, r := range submitAll(tr, 10) {
				for i, k := range r.Keys {
					require.Equal(t, tier.StatusTimedOut, k.Status, "%s, hung brick: request %d key %d: %v", name, req, i, k.Err)
					require.ErrorIs(t, k.Err, tier.ErrTimeout, "%s, hung brick: request %d key %d", name, req, i)
				}
			}
			st := tr.Stats()
			assert.GreaterOrEqual(t, st.Stuck, threshold, "%s: operations stuck in the hung filesystem", name)
			assert.True(t, st.BreakerOpen, "%s: the breaker did not open: %+v", name, st)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := b.Close(ctx)
		cancel()
		require.ErrorIs(t, err, tier.ErrStuck, "Close of B with its operations stuck in the hung brick")
		t.Logf("hung brick: Close of B: %v", err)

		require.NoError(t, syscall.Kill(brick, syscall.SIGCONT))
		continued = true
		worksAgain(a, 100)
		st := a.Stats()
		t.Logf("hung brick continued: A works again: %d late completions, breaker trips %d", st.Late, st.BreakerTrips)

		// Killed: the brick process dies; the clients lose their connection.
		require.NoError(t, syscall.Kill(g.BrickPid(t), syscall.SIGKILL))
		failed := map[tier.Op]int{}
		for req, r := range submitAll(a, 200) {
			for i, k := range r.Keys {
				require.Equal(t, tier.StatusFailed, k.Status, "killed brick: request %d key %d: %v", req, i, k.Err)
				var pe *fs.PathError
				require.True(t, errors.As(k.Err, &pe), "killed brick: request %d key %d: %T is not an *fs.PathError: %v", req, i, k.Err, k.Err)
				require.ErrorIs(t, k.Err, syscall.ENOTCONN, "killed brick: request %d key %d", req, i)
				failed[r.Op]++
			}
		}
		t.Logf("killed brick: keys failed with ENOTCONN by operation: %v", failed)
		g.Start(t)
		worksAgain(a, 300)
		verifyClean(t, a.BlockStore(), ns, "after the brick came back")
	})
}

// TestGlusterReplacedUnderLoad has client A replace blocks again and again (rename over the old file,
// content a, then b, then a…) while client B loads them, for each engine: a block replaced between B's
// path walk and its open or read is never reported failed (ESTALE) or missing, only loaded, whole, with
// one of the two contents. The kernel retries an open or a stat that meets ESTALE once with a fresh
// path walk (LOOKUP_REVAL); GlusterFS keeps an open file readable after it is replaced.
func TestGlusterReplacedUnderLoad(t *testing.T) {
	g := newGluster(t, 2, glusterCacheOff)
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		ns := "replaced-" + kind.String()
		mod := func(o *tier.Options) { o.Namespace = ns }
		a := openTier(t, kind, g.Mounts[0], mod)
		b := openTier(t, kind, g.Mounts[1], mod)
		const n = 8
		content := func(c, i int) []byte { return payload(1000*c+i, blockSize) }
		for i := range n {
			require.NoError(t, a.BlockStore().Put(ns, key(i), content(0, i)))
		}
		stop := make(chan struct{})
		var replaced int
		var wg sync.WaitGroup
		wg.Go(func() {
			results := make([]tier.Result, 4)
			for req := uint64(1); ; req++ {
				select {
				case <-stop:
					return
				default:
				}
				bufs := make([][]byte, n)
				for i := range bufs {
					bufs[i] = content(int(req%2), i)
				}
				if !assert.NoError(t, a.Store(req, keyRange(0, n), bufs)) {
					return
				}
				r, err := pollOne(a, req, results)
				if !assert.NoError(t, err) {
					return
				}
				for i, k := range r.Keys {
					if !assert.Equal(t, tier.StatusStored, k.Status, "A's replacement of key %d: %v", i, k.Err) {
						return
					}
				}
				replaced += n
			}
		})
		loads := map[int]int{}
		end := time.Now().Add(2 * time.Second)
		for req := uint64(1); time.Now().Before(end); req++ {
			bufs := buffers(n, blockSize)
			require.NoError(t, b.Load(req, keyRange(0, n), bufs))
			for i, k := range await(t, b, req)[req].Keys {
				require.Equal(t, tier.StatusLoaded, k.Status, "B's load of key %d while A replaces it: %v", i, k.Err)
				switch {
				case bytes.Equal(bufs[i], content(0, i)):
					loads[0]++
				case bytes.Equal(bufs[i], content(1, i)):
					loads[1]++
				default:
					t.Fatalf("B's load of key %d: neither content", i)
				}
			}
		}
		close(stop)
		wg.Wait()
		t.Logf("A replaced %d blocks while B loaded content a %d times and b %d times", replaced, loads[0], loads[1])
		require.Positive(t, replaced, "A replaced nothing")
		require.Positive(t, loads[1], "B never loaded a replacement")
		verifyClean(t, b.BlockStore(), ns, "after the replacements")
		assert.Empty(t, tempFiles(t, b.BlockStore(), ns), "temporary files")
	})
}
