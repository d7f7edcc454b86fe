package tier

import (
	"fmt"
	"hash/maphash"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// cachedPages returns how many of the file's pages are in the page cache.
func cachedPages(t *testing.T, path string) int {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestDirectBypassesPageCache checks that both engines load and store
// aligned buffers with O_DIRECT where the filesystem takes it, and through
// the page cache with NoDirect: offloaded blocks must not fill it.
func TestDirectBypassesPageCache(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, direct := range []bool{true, false} {
			t.Run(map[bool]string{true: "direct", false: "nodirect"}[direct], func(t *testing.T) {
				tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.NoDirect = !direct })
				e := tr.Engine()
				if direct && e.FS == "tmpfs" {
					t.Skip("tmpfs keeps every file in the page cache, O_DIRECT or not")
				}
				require.Equal(t, direct, e.Direct, "the probe: %s", e.NoDirect)
				const n = 4
				bufs := make([][]byte, n)
				for i := range bufs {
					bufs[i] = alignedBytes(testBlockSize)
					copy(bufs[i], testPayload(i))
				}
				keys := testKeys(0, 1, 2, 3)
				require.NoError(t, tr.Store(1, keys, bufs))
				for _, k := range await(t, tr, 1)[1].Keys {
					require.Equal(t, StatusStored, k.Status, "%v", k.Err)
				}
				cached := 0
				for i := range n {
					cached += cachedPages(t, blockFile(tr, i))
				}
				if direct {
					assert.Zero(t, cached, "pages cached by direct stores")
				} else {
					assert.Positive(t, cached, "buffered stores cached nothing")
				}

				for i := range n { // out of the cache, to see whether loads bring them back
					f, err := os.Open(blockFile(tr, i))
					require.NoError(t, err)
					require.NoError(t, unix.Fdatasync(int(f.Fd())))
					require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
					f.Close()
					require.Zero(t, cachedPages(t, blockFile(tr, i)))
				}
				for i := range bufs {
					clear(bufs[i])
				}
				require.NoError(t, tr.Load(2, keys, bufs))
				for i, k := range await(t, tr, 2)[2].Keys {
					require.Equal(t, StatusLoaded, k.Status, "%v", k.Err)
					require.Equal(t, testPayload(i), bufs[i])
				}
				cached = 0
				for i := range n {
					cached += cachedPages(t, blockFile(tr, i))
				}
				if direct {
					assert.Zero(t, cached, "pages cached by direct loads")
				} else {
					assert.Positive(t, cached, "buffered loads cached nothing")
				}
			})
		}
	})
}

// ringFiles returns the files in the fixed-file table of shard k's ring,
// as /proc lists them.
func ringFiles(t *testing.T, tr *Tier, k int) []string {
	fd := tr.shards[k].be.(*uringBackend).ring.FD()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	require.NoError(t, err)
	var files []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "UserFiles:"):
			in = true
		case in && strings.HasPrefix(line, " ") || in && len(line) > 0 && line[0] >= '0' && line[0] <= '9':
			files = append(files, strings.TrimSpace(line))
		case in:
			in = false
		}
	}
	return files
}

// TestProbedSlotsEmptied: a lookup by O_PATH leaves its file in the op's
// fixed-file slot; once the ring is idle the slot is emptied, so that a
// block removed meanwhile does not keep its inode and disk space.
func TestProbedSlotsEmptied(t *testing.T) {
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 1 })
	require.Equal(t, LookupOpenPath, tr.opts.Lookup)
	put(t, tr, 0, 1, 2)
	require.NoError(t, tr.Lookup(1, testKeys(0, 1, 2, 3)))
	assert.Equal(t, []Status{StatusFound, StatusFound, StatusFound, StatusMissing}, statuses(await(t, tr, 1)[1]))
	require.Eventually(t, func() bool {
		for _, f := range ringFiles(t, tr, 0) {
			if strings.Contains(f, tr.nsDir) {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "slots still hold %v", ringFiles(t, tr, 0))
}

// TestLoadsSpreadOverRings: a batch of loads is split evenly over the
// rings, even when every key's hash falls to one ring (they all would go
// to it if loads went by hash, as lookups do).
func TestLoadsSpreadOverRings(t *testing.T) {
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 2 })
	var idx []int
	for i := 0; len(idx) < 2*loadRun; i++ {
		if shardOfHash(maphash.Bytes(tr.seed, testKey(i)), 2) == 0 {
			idx = append(idx, i)
		}
	}
	put(t, tr, idx...)
	before := tr.Stats().RingOps
	require.Len(t, before, 2)
	bufs := make([][]byte, len(idx))
	for i := range bufs {
		bufs[i] = make([]byte, testBlockSize)
	}
	require.NoError(t, tr.Load(1, testKeys(idx...), bufs))
	res := await(t, tr, 1)[1]
	assert.Equal(t, len(idx), res.Prefix, "every block loaded: %v", statuses(res))
	after := tr.Stats().RingOps
	assert.Equal(t, []uint64{before[0] + loadRun, before[1] + loadRun}, after, "a batch's runs go to every ring")

	// Small batches go whole to one ring; with both idle, the rings take
	// them in turn.
	var rings []int
	for req := uint64(3); req < 7; req++ {
		require.NoError(t, tr.Load(req, testKeys(idx[:2]...), bufs[:2]))
		require.Equal(t, 2, await(t, tr, req)[req].Prefix)
		now := tr.Stats().RingOps
		for ring := range now {
			if now[ring] != after[ring] {
				assert.Equal(t, after[ring]+2, now[ring], "a load of 2 keys on one ring")
				rings = append(rings, ring)
			}
		}
		after = now
	}
	assert.True(t, slices.Equal(rings, []int{0, 1, 0, 1}) || slices.Equal(rings, []int{1, 0, 1, 0}), "rings in turn: %v", rings)

	// A ring with load keys unanswered gets none until the other has as many.
	tr.shards[0].loadKeys.Add(100) // as if a backlog waited there
	for req := uint64(7); req < 11; req++ {
		require.NoError(t, tr.Load(req, testKeys(idx[:2]...), bufs[:2]))
		require.Equal(t, 2, await(t, tr, req)[req].Prefix)
	}
	tr.shards[0].loadKeys.Add(-100)
	now := tr.Stats().RingOps
	assert.Equal(t, []uint64{after[0], after[1] + 8}, now, "every load to the ring without the backlog")
	after = now

	require.NoError(t, tr.Lookup(2, testKeys(idx...)))
	assert.Equal(t, len(idx), await(t, tr, 2)[2].Prefix)
	assert.Equal(t, after[1], tr.Stats().RingOps[1], "lookups go to the ring of their hash")
}

// TestLoadsKeepToTheirBuffersRing: a page-cache load into one of the
// tier's buffers goes to the ring its buffer's last load went to (where
// the buffer's lines are likely cached), where idle rings would take loads
// in turn, unless that ring has more than a run's keys unanswered beyond
// the other's; the buffer's home then moves with it. O_DIRECT loads, and
// loads into the caller's memory, take the rings in turn.
func TestLoadsKeepToTheirBuffersRing(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings, o.Buffers, o.NoDirect = 2, 2, !direct })
			require.Equal(t, direct, tr.Engine().Direct, "the probe: %s", tr.Engine().NoDirect)
			put(t, tr, 0)
			bufs := tr.Buffers()
			req := uint64(0)
			ringOf := func(buf []byte) int { // the ring that loaded key 0 into buf
				t.Helper()
				before := tr.Stats().RingOps
				req++
				require.NoError(t, tr.Load(req, testKeys(0), [][]byte{buf}))
				require.Equal(t, 1, await(t, tr, req)[req].Prefix, "key 0 loaded")
				after := tr.Stats().RingOps
				for ring := range after {
					if after[ring] != before[ring] {
						return ring
					}
				}
				t.Fatal("no ring took the load")
				return -1
			}
			if direct {
				first := ringOf(bufs[0])
				assert.Equal(t, []int{1 - first, first, 1 - first}, []int{ringOf(bufs[0]), ringOf(bufs[0]), ringOf(bufs[0])}, "O_DIRECT loads on the rings in turn")
				return
			}
			home := []int{ringOf(bufs[0]), ringOf(bufs[1])}
			for range 2 {
				for k, buf := range bufs {
					for range 3 { // in turn, the rings would alternate
						assert.Equal(t, home[k], ringOf(buf), "buffer %d's load on its ring", k)
					}
				}
			}

			// A ring with more than a run's keys unanswered beyond the
			// other's (one key here) loses the buffer, which then stays on
			// the other.
			other := 1 - home[0]
			tr.shards[home[0]].loadKeys.Add(2) // as if a backlog waited there
			assert.Equal(t, other, ringOf(bufs[0]), "a backlog sends the load to the other ring")
			tr.shards[home[0]].loadKeys.Add(-2)
			assert.Equal(t, other, ringOf(bufs[0]), "the buffer's home moved with it")

			// Memory of the caller's has no home: idle rings take its loads
			// in turn.
			own := make([]byte, testBlockSize)
			first := ringOf(own)
			assert.Equal(t, 1-first, ringOf(own), "the caller's memory on the rings in turn")
		})
	}
}

// TestLoadLearnedBeforeInvalidate: what a load on another ring learned of
// a key reaches the key's ring at its next intake, which may come after
// InvalidateLookups; it must not bring the emptied cache's knowledge back.
func TestLoadLearnedBeforeInvalidate(t *testing.T) {
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings, o.LookupCacheTTL = 2, time.Hour })
	var idx []int // two keys whose lookups go to ring 0: one of them is loaded on ring 1
	for i := 0; len(idx) < 2; i++ {
		if shardOfHash(maphash.Bytes(tr.seed, testKey(i)), 2) == 0 {
			idx = append(idx, i)
		}
	}
	put(t, tr, idx...)
	buf := make([]byte, testBlockSize)
	before := tr.Stats().RingOps
	for k, i := range idx { // with both rings idle they take loads in turn: one of these goes to ring 1
		require.NoError(t, tr.Load(uint64(10+k), testKeys(i), [][]byte{buf}))
		require.Equal(t, 1, await(t, tr, uint64(10+k))[uint64(10+k)].Prefix)
	}
	require.Equal(t, before[1]+1, tr.Stats().RingOps[1], "one key was loaded on ring 1")
	for _, i := range idx {
		require.NoError(t, tr.BlockStore().Delete(tr.Namespace(), testKey(i)))
	}
	tr.InvalidateLookups()
	require.NoError(t, tr.Lookup(2, testKeys(idx...)))
	assert.Equal(t, []Status{StatusMissing, StatusMissing}, statuses(await(t, tr, 2)[2]))
}
