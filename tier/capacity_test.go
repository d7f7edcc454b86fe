package tier

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
)

// testFileSize is the size of a framed test block's file.
const testFileSize = blockstore.HeaderSize + testBlockSize

// ageBlocks sets the times of the blocks idx to base + i seconds, so that
// a lower index is less recently used.
func ageBlocks(t *testing.T, tr *Tier, base time.Time, idx ...int) {
	t.Helper()
	for _, i := range idx {
		b, err := tr.BlockStore().Stat(tr.Namespace(), testKey(i))
		require.NoError(t, err)
		at := base.Add(time.Duration(i) * time.Second)
		require.NoError(t, os.Chtimes(b.Path, at, at))
	}
}

// present returns which of the blocks 0..n-1 are on disk.
func present(t *testing.T, tr *Tier, n int) []bool {
	t.Helper()
	out := make([]bool, n)
	for i := range out {
		ok, err := tr.BlockStore().Has(tr.Namespace(), testKey(i))
		require.NoError(t, err)
		out[i] = ok
	}
	return out
}

// waitStats polls tr's Stats until cond holds, for at most 10 s: a bound
// on liveness, not a measure of speed.
func waitStats(t *testing.T, tr *Tier, what string, cond func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := tr.Stats()
		if cond(st) {
			return st
		}
		require.True(t, time.Now().Before(deadline), "%s: never happened; stats %+v", what, st)
		time.Sleep(5 * time.Millisecond)
	}
}

// seedOld puts blocks 0..n-1 into dir through a tier of its own, closed
// again, with block i last used at base + i seconds, ten minutes ago; it
// returns base. Less than 1,024 s before the blocks the tests store now:
// Index.Victims keeps LRU to the second only over such a range (over an
// hour, its 4-second buckets took blocks 3-6 in directory order, and
// TestEvictPastBlocksUsedElsewhere once saw 6 go before 4 in CI).
func seedOld(t *testing.T, kind EngineKind, dir string, n int) time.Time {
	t.Helper()
	seed := openTier(t, kind, dir, nil)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	put(t, seed, idx...)
	base := time.Now().Add(-10 * time.Minute)
	ageBlocks(t, seed, base, idx...)
	require.NoError(t, seed.Close(context.Background()))
	return base
}

func capacityOptions(blocks int) func(*Options) {
	return func(o *Options) {
		o.Capacity = int64(blocks) * testFileSize
		o.EvictInterval = 10 * time.Millisecond
		o.EvictMinAge = -1
	}
}

// TestCapacityEvictsLRU: a namespace over its high mark is brought down to
// its low mark by removing the least recently used blocks, exactly; a
// block the tier loads since is kept (its use was recorded on the file),
// and the next least recently used go instead.
func TestCapacityEvictsLRU(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		dir := t.TempDir()
		// Capacity 20 blocks: high mark 18, low mark 16. 24 blocks: 8 go.
		seedOld(t, kind, dir, 24)

		tr := openTier(t, kind, dir, capacityOptions(20))
		st := waitStats(t, tr, "eviction to the low mark", func(s Stats) bool { return s.Evicted == 8 && s.Usage == 16*testFileSize })
		assert.Equal(t, uint64(8*testFileSize), st.EvictedBytes)
		assert.True(t, st.Evictor)
		assert.Equal(t, uint64(1), st.Scans)
		assert.Equal(t, int64(24), st.ScanBlocks)
		want := make([]bool, 24)
		for i := 8; i < 24; i++ {
			want[i] = true
		}
		assert.Equal(t, want, present(t, tr, 24), "the 8 least recently used went")

		// Block 8 is now the least recently used; a load marks it used.
		require.NoError(t, tr.Load(1, testKeys(8), [][]byte{make([]byte, testBlockSize)}))
		require.Equal(t, []Status{StatusLoaded}, statuses(await(t, tr, 1)[1]))
		waitStats(t, tr, "the load's touch", func(s Stats) bool { return s.Touches == 1 })
		// Three new blocks: 19 > 18, so 3 go: 9, 10 and 11, not 8.
		require.NoError(t, tr.Store(2, testKeys(24, 25, 26), [][]byte{testPayload(24), testPayload(25), testPayload(26)}))
		require.Equal(t, []Status{StatusStored, StatusStored, StatusStored}, statuses(await(t, tr, 2)[2]))
		waitStats(t, tr, "the second eviction", func(s Stats) bool { return s.Evicted == 11 })
		got := present(t, tr, 27)
		assert.True(t, got[8], "the block loaded since the scan was evicted")
		assert.Equal(t, []bool{false, false, false}, got[9:12], "the next least recently used stayed")
		assert.Equal(t, []bool{true, true, true}, got[24:27], "new blocks went")
		// The estimate may count a store twice until the next look; then
		// it is the low mark, and no more blocks went.
		st = waitStats(t, tr, "usage at the low mark", func(s Stats) bool { return s.Usage == 16*testFileSize })
		assert.Equal(t, uint64(11), st.Evicted)
	})
}

// TestEvictPastBlocksUsedElsewhere: victims that another process used
// since the evictor read their times (their files' times changed behind
// its back, as another tier's loads change them) are kept, and the next
// least recently used go in their place, down to the low mark in one
// look. An evictor that stopped at the victims it first chose left usage
// at the high mark for good.
func TestEvictPastBlocksUsedElsewhere(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		dir := t.TempDir()
		old := seedOld(t, kind, dir, 17)
		// Old directories too, or the evictor's rescans read them again
		// (a directory changed within the second of its last read may
		// change again unseen) and learn the new times on their own.
		require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				err = os.Chtimes(p, old, old)
			}
			return err
		}))

		// Capacity 20 blocks: high mark 18, low mark 16. 17 blocks: none go.
		tr := openTier(t, kind, dir, capacityOptions(20))
		waitStats(t, tr, "the first count", func(s Stats) bool { return s.Scans == 1 && s.Usage == 17*testFileSize })
		// Another process loads blocks 0 and 1, the least recently used.
		for _, i := range []int{0, 1} {
			b, err := tr.BlockStore().Stat(tr.Namespace(), testKey(i))
			require.NoError(t, err)
			now := time.Now()
			require.NoError(t, os.Chtimes(b.Path, now, now))
		}
		// Two new blocks: 19 > 18, so 3 go; the first choice is 0, 1 and 2,
		// of which only 2 is still unused: 3 and 4 go too.
		require.NoError(t, tr.Store(1, testKeys(17, 18), [][]byte{testPayload(17), testPayload(18)}))
		require.Equal(t, []Status{StatusStored, StatusStored}, statuses(await(t, tr, 1)[1]))
		st := waitStats(t, tr, "eviction to the low mark", func(s Stats) bool { return s.Evicted >= 3 && s.Usage == 16*testFileSize })
		assert.Equal(t, uint64(3), st.Evicted)
		want := make([]bool, 19)
		for i := range want {
			want[i] = i < 2 || i > 4
		}
		assert.Equal(t, want, present(t, tr, 19), "blocks 0 and 1 were used elsewhere; 2, 3 and 4 went")
	})
}

// TestCapacityFull: when every block is younger than EvictMinAge, nothing
// can go, and stores at the capacity are refused before they write.
func TestCapacityFull(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *Options) {
			capacityOptions(10)(o)
			o.EvictMinAge = time.Hour
		})
		idx := make([]int, 10)
		bufs := make([][]byte, 10)
		for i := range idx {
			idx[i], bufs[i] = i, testPayload(i)
		}
		waitStats(t, tr, "the first count", func(s Stats) bool { return s.Scans == 1 })
		require.NoError(t, tr.Store(1, testKeys(idx...), bufs))
		for _, s := range statuses(await(t, tr, 1)[1]) {
			require.Equal(t, StatusStored, s)
		}
		waitStats(t, tr, "usage counted", func(s Stats) bool { return s.Scans > 0 && s.Usage == 10*testFileSize })
		require.NoError(t, tr.Store(2, testKeys(10, 11), bufs[:2]))
		r := await(t, tr, 2)[2]
		for _, k := range r.Keys {
			require.Equal(t, StatusFull, k.Status)
			require.ErrorIs(t, k.Err, ErrFull)
		}
		assert.Equal(t, []bool{false, false}, present(t, tr, 12)[10:], "a refused store wrote its block")
		assertNoTempFiles(t, tr)
		st := tr.Stats()
		assert.Equal(t, uint64(2), st.Outcomes[OpStore][StatusFull])
		assert.Zero(t, st.Evicted, "evicted blocks younger than EvictMinAge")
		assert.Zero(t, st.Failures[OpStore][FailureNoSpace], "ErrFull is not the filesystem's")
		t.Logf("refused store of 2 keys: %v, submit to result", st.RequestLatency[OpStore].Quantile(0))
	})
}

// TestOneEvictor: of two tiers on one directory, one holds the lease and
// evicts; when it closes, the other takes over.
func TestOneEvictor(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		dir := t.TempDir()
		a := openTier(t, kind, dir, capacityOptions(1000))
		b := openTier(t, kind, dir, capacityOptions(1000))
		waitStats(t, a, "an evictor", func(Stats) bool { return a.Stats().Evictor || b.Stats().Evictor })
		holder, other := a, b
		if b.Stats().Evictor {
			holder, other = b, a
		}
		// A few intervals on, still exactly one.
		time.Sleep(50 * time.Millisecond)
		require.True(t, holder.Stats().Evictor)
		require.False(t, other.Stats().Evictor, "two evictors")
		assert.NotEmpty(t, other.Stats().EvictorHolder, "the other does not know the holder")
		put(t, other, 1, 2, 3)
		waitStats(t, other, "the usage published by the holder", func(s Stats) bool { return s.Usage == 3*testFileSize })
		require.NoError(t, holder.Close(context.Background()))
		waitStats(t, other, "a takeover", func(s Stats) bool { return s.Evictor })
	})
}

// TestFullUntilCounted: until the usage is first known, a tier on a
// filesystem that holds more than its capacity refuses stores; once a
// count is published, it takes them. The test holds the lease itself, so
// the tier never counts.
func TestFullUntilCounted(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		dir := t.TempDir()
		var sf unix.Statfs_t
		require.NoError(t, unix.Statfs(dir, &sf))
		require.Greater(t, int64(sf.Blocks-sf.Bfree)*sf.Bsize, int64(100*testFileSize), "the test needs a filesystem holding more than 100 blocks")
		nsDir := filepath.Join(dir, "default")
		require.NoError(t, os.Mkdir(nsDir, 0o755))
		l, err := blockstore.TryLease(nsDir, "the test")
		require.NoError(t, err)
		defer l.Close()

		tr := openTier(t, kind, dir, capacityOptions(100))
		require.NoError(t, tr.Store(1, testKeys(0), [][]byte{testPayload(0)}))
		r := await(t, tr, 1)[1]
		require.Equal(t, StatusFull, r.Keys[0].Status, "a store before any count")
		waitStats(t, tr, "the holder learned", func(s Stats) bool { return s.EvictorHolder == "the test" })

		require.NoError(t, l.Publish([]byte("usage 0 at 1\n")))
		waitStats(t, tr, "the published count", func(s Stats) bool { return s.Usage == 0 })
		require.NoError(t, tr.Store(2, testKeys(0), [][]byte{testPayload(0)}))
		require.Equal(t, []Status{StatusStored}, statuses(await(t, tr, 2)[2]))
		assert.Zero(t, tr.Stats().Scans, "a tier without the lease scanned")
	})
}

// TestStatfsSkipsRescans: while the whole filesystem holds less than the
// high mark, the evictor rescans nothing; with a capacity below what the
// filesystem holds, it rescans the directories stores change.
func TestStatfsSkipsRescans(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, c := range []struct {
			name     string
			capacity int64
			rescans  bool
		}{{"room", 1 << 60, false}, {"tight", 1000 * testFileSize, true}} {
			t.Run(c.name, func(t *testing.T) {
				tr := openTier(t, kind, t.TempDir(), func(o *Options) {
					capacityOptions(0)(o)
					o.Capacity = c.capacity
				})
				waitStats(t, tr, "the first scan", func(s Stats) bool { return s.Scans == 1 })
				for i := range 5 {
					require.NoError(t, tr.Store(uint64(i), testKeys(i), [][]byte{testPayload(i)}))
					require.Equal(t, []Status{StatusStored}, statuses(await(t, tr, uint64(i))[uint64(i)]))
					time.Sleep(3 * tr.opts.EvictInterval)
				}
				st := tr.Stats()
				if c.rescans {
					assert.Positive(t, st.DirsRescanned, "no rescan with the filesystem above the high mark")
				} else {
					assert.Zero(t, st.DirsRescanned, "rescans with room on the filesystem")
				}
				assert.Equal(t, uint64(1), st.Scans)
			})
		}
	})
}

// TestEstimate: between counts a tier adds to the last count what all
// tiers were adding at the evictor's measured rate, or its own stores if
// they are more.
func TestEstimate(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name                   string
		usage, rate, own, want int64
		ago                    time.Duration
	}{
		{"no rate: count and own stores", 100 + 500, 0, 500, 600, 2 * time.Second},
		{"the rate predicts more than own", 100 + 500, 1000, 500, 2100, 2 * time.Second},
		{"own stores more than the rate", 100 + 5000, 1000, 5000, 5100, 2 * time.Second},
		{"a count from the future", 100, 1000, 0, 100, -time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			var tr Tier
			tr.cap.usage.Store(c.usage)
			tr.cap.rate.Store(c.rate)
			tr.cap.sinceCount.Store(c.own)
			tr.cap.countAt.Store(now.Add(-c.ago).UnixNano())
			assert.Equal(t, c.want, tr.estimate(now))
		})
	}
	for _, c := range []struct {
		state           string
		usage, at, rate int64
		ok              bool
	}{
		{"usage 10 at 20 rate 30\n", 10, 20, 30, true},
		{"usage 10 at 20\n", 10, 20, 0, true},
		{"usage 10 at 20 rate -5\n", 10, 20, 0, true},
		{"usage x at 20", 0, 20, 0, false},
		{"", 0, 0, 0, false},
	} {
		usage, at, rate, ok := parseState([]byte(c.state))
		assert.Equal(t, c.ok, ok, "%q", c.state)
		if ok {
			assert.Equal(t, []int64{c.usage, c.at, c.rate}, []int64{usage, at, rate}, "%q", c.state)
		}
	}
}
