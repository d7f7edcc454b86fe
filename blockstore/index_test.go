package blockstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newTestIndex returns an index of ns in s, and the namespace directory.
func newTestIndex(t *testing.T, s *Store, ns string) (*Index, string) {
	t.Helper()
	x, err := s.NewIndex(ns)
	require.NoError(t, err)
	return x, filepath.Join(s.Root(), ns)
}

// checkIndex asserts the index's invariants and its usage.
func checkIndex(t *testing.T, x *Index, blocks, bytes int64) {
	t.Helper()
	require.NoError(t, x.checkInvariants())
	b, n := x.Usage()
	assert.Equal(t, blocks, b, "blocks")
	assert.Equal(t, bytes, n, "bytes")
}

// ageRound makes each ageing time distinct, so an aged directory's mtime
// differs from the one the index recorded.
var ageRound int

// age sets the mtimes of paths well before the dirty window, each call to
// a time no earlier call used.
func age(t *testing.T, paths ...string) {
	t.Helper()
	ageRound++
	at := time.Now().Add(-time.Hour).Add(time.Duration(ageRound) * time.Second)
	for _, p := range paths {
		require.NoError(t, os.Chtimes(p, at, at))
	}
}

// allDirs returns every directory under (and including) dir.
func allDirs(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			out = append(out, p)
		}
		return err
	}))
	return out
}

// leafOf returns the fan-out directory chain of key: namespace, top, leaf.
func leafOf(nsDir string, key []byte) (top, leaf string) {
	leaf = filepath.Join(nsDir, string(FanoutLayout{}.AppendDir(nil, key)))
	return filepath.Dir(leaf), leaf
}

func TestIndexScan(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		size int   // payload
		file int64 // file size
	}{
		{"framed", Options{}, 100, HeaderSize + 100},
		{"raw", Options{Format: FormatRaw, BlockSize: 300}, 300, 300},
		{"raw-vllm", Options{Format: FormatRaw, BlockSize: 200, Layout: VLLMLayout{Group: 1}}, 200, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openTestStore(t, tc.opts)
			const n = 37
			keys := fill(t, s, "ns", 0, n, tc.size)
			fill(t, s, "other", 100, 5, tc.size) // another namespace is not counted
			x, nsDir := newTestIndex(t, s, "ns")
			checkIndex(t, x, 0, 0)
			// Strays: a temporary file, a foreign file, a misplaced block
			// file, a symlink to a block, a directory of no block.
			l := s.Layout()
			tmp := filepath.Join(nsDir, string(l.AppendTempPath(nil, keys[0], 7)))
			require.NoError(t, os.WriteFile(tmp, []byte("tmp"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(nsDir, "README"), []byte("x"), 0o644))
			misplaced := filepath.Join(nsDir, filepath.Base(string(l.AppendPath(nil, keys[1]))))
			require.NoError(t, os.WriteFile(misplaced, []byte("x"), 0o644))
			stray := testKey(500, 32)
			require.NoError(t, s.EnsureDir("ns", stray))
			require.NoError(t, os.Symlink(filepath.Join(nsDir, string(l.AppendPath(nil, keys[2]))),
				filepath.Join(nsDir, string(l.AppendPath(nil, stray)))))
			require.NoError(t, os.MkdirAll(filepath.Join(nsDir, "junk", "deeper"), 0o755))

			var calls [][2]int64
			require.NoError(t, x.Scan(func(b, n int64) { calls = append(calls, [2]int64{b, n}) }))
			checkIndex(t, x, n, n*tc.file)
			require.NotEmpty(t, calls)
			assert.Equal(t, [2]int64{n, n * tc.file}, calls[len(calls)-1], "progress at the end")

			// Every block is a victim once, with its key.
			v := x.Victims(1<<62, 0, time.Now().Add(time.Hour), nil)
			var got [][]byte
			for _, v := range v {
				assert.Equal(t, tc.file, v.Size)
				got = append(got, v.Key)
			}
			sortKeys(got)
			sortKeys(keys)
			assert.Equal(t, keys, got)

			// A second Scan replaces, it does not add.
			require.NoError(t, x.Scan(nil))
			checkIndex(t, x, n, n*tc.file)
		})
	}
}

func TestIndexScanProgress(t *testing.T) {
	s := openTestStore(t, Options{})
	x, nsDir := newTestIndex(t, s, "ns")
	require.NoError(t, x.Scan(nil), "a missing namespace is empty")
	checkIndex(t, x, 0, 0)
	const n = 3 * progressBlocks
	indexTree(t, nsDir, n, 100)
	var calls []int64
	require.NoError(t, x.Scan(func(b, _ int64) { calls = append(calls, b) }))
	checkIndex(t, x, n, 64*n)
	require.GreaterOrEqual(t, len(calls), 3, "about every %d blocks: %v", progressBlocks, calls)
	assert.True(t, slices.IsSorted(calls), "%v", calls)
	for i := 1; i < len(calls)-1; i++ {
		assert.GreaterOrEqual(t, calls[i]-calls[i-1], int64(progressBlocks))
	}
	assert.Equal(t, int64(n), calls[len(calls)-1])
}

func TestIndexRefresh(t *testing.T) {
	const size = 100
	const file = HeaderSize + size
	s := openTestStore(t, Options{})
	keys := fill(t, s, "ns", 0, 20, size)
	x, nsDir := newTestIndex(t, s, "ns")
	dirs := allDirs(t, nsDir)
	age(t, dirs...)
	require.NoError(t, x.Scan(nil))
	checkIndex(t, x, 20, 20*file)

	// Untouched: every directory statted, none read.
	st, err := x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, RefreshStats{Dirs: len(dirs)}, st)
	checkIndex(t, x, 20, 20*file)

	// A Put in a new top-level and leaf directory: the namespace
	// directory is read and the two new ones scanned.
	var fresh []byte
	for i := 1000; fresh == nil; i++ {
		k := testKey(i, 32)
		if _, err := os.Stat(filepath.Join(nsDir, string(appendHex(nil, k[:1])))); os.IsNotExist(err) {
			fresh = k
		}
	}
	require.NoError(t, s.Put("ns", fresh, testPayload(fresh, size)))
	top, leaf := leafOf(nsDir, fresh)
	age(t, nsDir, top, leaf)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, RefreshStats{Dirs: len(dirs), Changed: 3, Added: 1}, st)
	checkIndex(t, x, 21, 21*file)

	// A Put in an existing leaf directory.
	sibling := slices.Clone(keys[3])
	sibling[31] ^= 0xff // same leaf directory, another key
	_, leaf = leafOf(nsDir, keys[3])
	require.NoError(t, s.Put("ns", sibling, testPayload(sibling, size)))
	age(t, leaf)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, RefreshStats{Dirs: len(dirs) + 2, Changed: 1, Added: 1}, st)
	checkIndex(t, x, 22, 22*file)

	// A Delete.
	require.NoError(t, s.Delete("ns", keys[5]))
	_, leaf = leafOf(nsDir, keys[5])
	age(t, leaf)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, RefreshStats{Dirs: len(dirs) + 2, Changed: 1, Removed: 1}, st)
	checkIndex(t, x, 21, 21*file)

	// A block replaced (here by a larger one): neither added nor removed,
	// its size updated.
	require.NoError(t, s.Put("ns", keys[6], testPayload(keys[6], 2*size)))
	_, leaf = leafOf(nsDir, keys[6])
	age(t, leaf)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, RefreshStats{Dirs: len(dirs) + 2, Changed: 1}, st)
	checkIndex(t, x, 21, 20*file+HeaderSize+2*size)

	// A leaf directory removed with its blocks: dropped, and no longer statted.
	top, leaf = leafOf(nsDir, keys[7])
	inLeaf := 0
	for i, k := range append(keys, fresh, sibling) {
		if _, l := leafOf(nsDir, k); l == leaf && i != 5 {
			inLeaf++
		}
	}
	require.NoError(t, os.RemoveAll(leaf))
	age(t, top)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(inLeaf), st.Removed)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, len(dirs)+1, st.Dirs)
	b, _ := x.Usage()
	assert.Equal(t, int64(21-inLeaf), b)
	require.NoError(t, x.checkInvariants())

	// The namespace removed, then recreated.
	require.NoError(t, os.RemoveAll(nsDir))
	_, err = x.Refresh()
	require.NoError(t, err)
	checkIndex(t, x, 0, 0)
	require.NoError(t, s.Put("ns", keys[0], testPayload(keys[0], size)))
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Added)
	checkIndex(t, x, 1, file)
}

// TestIndexSameTick: a directory read while its mtime was within the
// dirty window is read again, so a change in the same timestamp tick (the
// mtime does not move) is not missed.
func TestIndexSameTick(t *testing.T) {
	const size = 10
	s := openTestStore(t, Options{})
	a := testKey(1, 32)
	require.NoError(t, s.Put("ns", a, testPayload(a, size)))
	x, nsDir := newTestIndex(t, s, "ns")
	_, leaf := leafOf(nsDir, a)
	fi, err := os.Stat(leaf)
	require.NoError(t, err)
	mtime := fi.ModTime()
	require.Less(t, time.Since(mtime), dirtyWindow, "a fresh directory")
	require.NoError(t, x.Scan(nil))
	checkIndex(t, x, 1, HeaderSize+size)

	// Another block in the same directory, in the same tick: the mtime
	// is what the index saw.
	b := append([]byte(nil), a...)
	b[31] ^= 0xff
	require.NoError(t, s.Put("ns", b, testPayload(b, size)))
	require.NoError(t, os.Chtimes(leaf, mtime, mtime))
	st, err := x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Added, "the same-tick change was missed")
	assert.Equal(t, 3, st.Changed, "every directory was fresh when read")
	checkIndex(t, x, 2, 2*(HeaderSize+size))

	// Once read with an old mtime, a directory is trusted.
	age(t, allDirs(t, nsDir)...)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, 3, st.Changed)
	st, err = x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, 0, st.Changed)
}

// agedBlocks puts n blocks into ns, block i last used at base + i*step,
// and returns their keys.
func agedBlocks(t *testing.T, s *Store, ns string, n int, base time.Time, step time.Duration, size int) [][]byte {
	t.Helper()
	keys := fill(t, s, ns, 0, n, size)
	for i, k := range keys {
		b, err := s.Stat(ns, k)
		require.NoError(t, err)
		at := base.Add(time.Duration(i) * step)
		require.NoError(t, os.Chtimes(b.Path, at, at))
	}
	return keys
}

func TestIndexVictims(t *testing.T) {
	const n, size = 50, 100
	const file = HeaderSize + size
	now := time.Now().Truncate(time.Second)
	base := now.Add(-100 * time.Minute)
	s := openTestStore(t, Options{})
	keys := agedBlocks(t, s, "ns", n, base, time.Minute, size) // block i used at now-100min+i min
	x, _ := newTestIndex(t, s, "ns")
	require.NoError(t, x.Scan(nil))

	keysOf := func(vs []Victim) [][]byte {
		var out [][]byte
		for _, v := range vs {
			out = append(out, v.Key)
		}
		return out
	}
	// Enough for 3.5 blocks: the four oldest, oldest first.
	v := x.Victims(3*file+file/2, 0, now, nil)
	assert.Equal(t, keys[:4], keysOf(v))
	for i, v := range v {
		assert.Equal(t, base.Add(time.Duration(i)*time.Minute), v.Used)
		assert.Equal(t, int64(file), v.Size)
	}
	// Appended to dst.
	dst := []Victim{{Size: -5}}
	v = x.Victims(1, 0, now, dst)
	require.Len(t, v, 2)
	assert.Equal(t, int64(-5), v[0].Size)
	assert.Equal(t, keys[0], v[1].Key)
	// minAge: blocks used within the last 95 minutes are not eligible.
	v = x.Victims(1<<40, 95*time.Minute, now, nil)
	assert.Equal(t, keys[:5], keysOf(v))
	assert.Empty(t, x.Victims(1<<40, 101*time.Minute, now, nil))
	assert.Empty(t, x.Victims(0, 0, now, nil))
	assert.Len(t, x.Victims(1<<40, 0, now, nil), n)
}

// TestIndexVictimsWide: over a range wider than the histogram's buckets
// the victims are still oldest first, enough, and include every block of
// the older buckets.
func TestIndexVictimsWide(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	const n, size = 300, 10
	const file = HeaderSize + size
	now := time.Now().Truncate(time.Second)
	s := openTestStore(t, Options{})
	keys := fill(t, s, "ns", 0, n, size)
	used := map[string]time.Time{}
	for _, k := range keys {
		at := now.Add(-time.Duration(rng.IntN(30*24*3600)) * time.Second)
		b, err := s.Stat("ns", k)
		require.NoError(t, err)
		require.NoError(t, os.Chtimes(b.Path, at, at))
		used[string(k)] = at
	}
	x, _ := newTestIndex(t, s, "ns")
	require.NoError(t, x.Scan(nil))
	const want = 40
	v := x.Victims(want*file, 0, now, nil)
	require.Len(t, v, want, "seed %d", seed)
	assert.True(t, slices.IsSortedFunc(v, func(a, b Victim) int { return a.Used.Compare(b.Used) }), "seed %d", seed)
	// Whatever was left out is no older than the oldest bucket's width
	// (30 days / 1024 ≈ 42 min) before the newest victim.
	chosen := map[string]bool{}
	for _, v := range v {
		chosen[string(v.Key)] = true
		assert.Equal(t, used[string(v.Key)], v.Used, "seed %d", seed)
	}
	newest := v[len(v)-1].Used
	for _, k := range keys {
		if !chosen[string(k)] {
			assert.False(t, used[string(k)].Before(newest.Add(-43*time.Minute)), "seed %d: %x left out", seed, k)
		}
	}
}

func TestIndexRecheck(t *testing.T) {
	const n, size = 6, 100
	const file = HeaderSize + size
	now := time.Now().Truncate(time.Second)
	base := now.Add(-time.Hour)
	s := openTestStore(t, Options{})
	keys := agedBlocks(t, s, "ns", n, base, time.Minute, size)
	x, _ := newTestIndex(t, s, "ns")
	require.NoError(t, x.Scan(nil))
	v := x.Victims(3*file, 0, now, nil)
	require.Len(t, v, 3)

	// Another process read block 0 after the scan: its atime moved.
	b0, err := s.Stat("ns", keys[0])
	require.NoError(t, err)
	require.NoError(t, os.Chtimes(b0.Path, now, b0.ModTime))
	// Block 1 is gone; block 2 is untouched.
	require.NoError(t, s.Delete("ns", keys[1]))
	v0 := v[0]
	kept, err := x.RecheckAll(v)
	require.NoError(t, err)
	require.Len(t, kept, 1, "a block used since and a gone block are no victims")
	assert.Equal(t, keys[2], kept[0].Key)
	checkIndex(t, x, n-1, (n-1)*file)

	// The index remembers: block 0 is now the newest, block 1 gone.
	all := x.Victims(1<<40, 0, now.Add(time.Second), nil)
	require.Len(t, all, n-1)
	assert.Equal(t, keys[0], all[n-2].Key)
	assert.Equal(t, now, all[n-2].Used)
	assert.Equal(t, keys[2], all[0].Key)

	// After a Refresh moved things, RecheckAll still finds its block.
	require.NoError(t, s.Put("ns", testKey(100, 32), testPayload(testKey(100, 32), size)))
	_, err = x.Refresh()
	require.NoError(t, err)
	require.NoError(t, os.Remove(b0.Path))
	kept, err = x.RecheckAll([]Victim{v0})
	require.NoError(t, err)
	assert.Empty(t, kept)
	checkIndex(t, x, n-1, (n-1)*file)
}

func TestIndexForget(t *testing.T) {
	const n, size = 10, 100
	const file = HeaderSize + size
	now := time.Now().Truncate(time.Second)
	s := openTestStore(t, Options{})
	keys := agedBlocks(t, s, "ns", n, now.Add(-time.Hour), time.Minute, size)
	x, nsDir := newTestIndex(t, s, "ns")
	age(t, allDirs(t, nsDir)...)
	require.NoError(t, x.Scan(nil))
	v := x.Victims(2*file, 0, now, nil)
	require.Len(t, v, 2)
	require.Equal(t, keys[:2], [][]byte{v[0].Key, v[1].Key})

	// Block 0 deleted and forgotten; forgetting it again changes nothing.
	require.NoError(t, s.Delete("ns", v[0].Key))
	x.Forget(v[0])
	checkIndex(t, x, n-1, (n-1)*file)
	x.Forget(v[0])
	checkIndex(t, x, n-1, (n-1)*file)
	// Block 1 forgotten but not deleted (the caller's unlink failed).
	x.Forget(v[1])
	checkIndex(t, x, n-2, (n-2)*file)
	assert.NotContains(t, x.Victims(1<<40, 0, now, nil), v[1], "a forgotten block is no victim")

	// A Refresh reading both directories: block 0 stays gone (not counted
	// as removed twice), block 1 comes back.
	_, l0 := leafOf(nsDir, keys[0])
	_, l1 := leafOf(nsDir, keys[1])
	age(t, l0, l1)
	st, err := x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(0), st.Removed)
	assert.Equal(t, int64(1), st.Added)
	checkIndex(t, x, n-1, (n-1)*file)

	// A Forget after the Refresh moved the entries still finds its block.
	v = x.Victims(file, 0, now, nil)
	require.Equal(t, keys[1], v[0].Key)
	require.NoError(t, s.Delete("ns", keys[1]))
	require.NoError(t, s.Put("ns", testKey(100, 32), testPayload(testKey(100, 32), size))) // moves positions if in the same directory
	_, err = x.Refresh()
	require.NoError(t, err)
	x.Forget(v[0])
	checkIndex(t, x, n-1, (n-1)*file)
	age(t, allDirs(t, nsDir)...)
	_, err = x.Refresh()
	require.NoError(t, err)
	checkIndex(t, x, n-1, (n-1)*file)
}

// TestIndexSymlinkedDir: a directory replaced by a symlink to another is
// dropped with its blocks, not followed.
func TestIndexSymlinkedDir(t *testing.T) {
	const size = 10
	s := openTestStore(t, Options{})
	a := testKey(1, 32)
	require.NoError(t, s.Put("ns", a, testPayload(a, size)))
	other := t.TempDir()
	x, nsDir := newTestIndex(t, s, "ns")
	require.NoError(t, x.Scan(nil))
	checkIndex(t, x, 1, HeaderSize+size)
	top, leaf := leafOf(nsDir, a)
	require.NoError(t, os.Rename(leaf, filepath.Join(other, "leaf")))
	require.NoError(t, os.Symlink(filepath.Join(other, "leaf"), leaf))
	age(t, top)
	st, err := x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Removed)
	checkIndex(t, x, 0, 0)
	assert.Len(t, x.dirs, 2, "the namespace and top directories")
}

func TestIndexInvalidNamespace(t *testing.T) {
	s := openTestStore(t, Options{})
	_, err := s.NewIndex("../x")
	require.ErrorIs(t, err, ErrInvalidNamespace)
}

// TestIndexVictimsNoAllocs: choosing victims allocates nothing once dst
// is large enough.
func TestIndexVictimsNoAllocs(t *testing.T) {
	s := openTestStore(t, Options{})
	agedBlocks(t, s, "ns", 20, time.Now().Add(-time.Hour), time.Minute, 10)
	x, _ := newTestIndex(t, s, "ns")
	require.NoError(t, x.Scan(nil))
	dst := make([]Victim, 0, 20)
	now := time.Now()
	allocs := testing.AllocsPerRun(10, func() { dst = x.Victims(1<<40, 0, now, dst[:0]) })
	assert.Zero(t, allocs)
	assert.Len(t, dst, 20)
}

// indexTree writes n block files of the fan-out layout under nsDir, their
// keys spread over about n/perDir leaf directories (as hashes spread
// 10 M blocks over 65,536), and returns the leaf directories.
func indexTree(tb testing.TB, nsDir string, n, perDir int) []string {
	tb.Helper()
	leaves := max(n/perDir, 1)
	seen := map[string]bool{}
	var dirs []string
	payload := make([]byte, 64)
	for i := range n {
		k := testKey(i, 32)
		d := i % leaves
		k[0], k[1] = byte(d), byte(d>>8)
		p := filepath.Join(nsDir, string(FanoutLayout{}.AppendPath(nil, k)))
		if dir := filepath.Dir(p); !seen[dir] {
			seen[dir] = true
			dirs = append(dirs, dir)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				tb.Fatal(err)
			}
		}
		if err := os.WriteFile(p, payload, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dirs
}

// benchIndex returns an index over a fresh tree of indexBenchBlocks blocks
// whose directories are aged, and the tree's leaf directories.
func benchIndex(b *testing.B) (*Index, []string) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	x, err := s.NewIndex("ns")
	if err != nil {
		b.Fatal(err)
	}
	leaves := indexTree(b, x.nsDir, indexBenchBlocks, indexBenchPerDir)
	var all []string
	if err := filepath.WalkDir(x.nsDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			all = append(all, p)
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	at := time.Now().Add(-time.Hour)
	for _, d := range all {
		if err := os.Chtimes(d, at, at); err != nil {
			b.Fatal(err)
		}
	}
	return x, leaves
}

const (
	// indexBenchBlocks is the benchmarks' tree size.
	indexBenchBlocks = 200_000
	// indexBenchPerDir is blocks per leaf directory, as at 10 M blocks
	// over 65,536 leaves.
	indexBenchPerDir = 150
)

// BenchmarkIndexScan measures a full Scan (ns/block), the index's heap
// (heapB/block) and Victims of 1% of the bytes (victims-ns/block).
func BenchmarkIndexScan(b *testing.B) {
	x, _ := benchIndex(b)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	y, err := x.s.NewIndex("ns")
	if err != nil {
		b.Fatal(err)
	}
	if err := y.Scan(nil); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	blocks, _ := y.Usage()
	if blocks != indexBenchBlocks {
		b.Fatalf("scanned %d blocks, want %d", blocks, indexBenchBlocks)
	}
	heap := float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / indexBenchBlocks
	// Victims of 1% of the bytes, over every entry.
	_, size := y.Usage()
	const victimRuns = 20
	var victims []Victim
	start := time.Now()
	for range victimRuns {
		victims = y.Victims(size/100, 0, time.Now(), victims[:0])
	}
	victimNs := float64(time.Since(start).Nanoseconds()) / victimRuns / indexBenchBlocks
	if len(victims) < indexBenchBlocks/100 {
		b.Fatalf("%d victims for 1%% of %d blocks", len(victims), indexBenchBlocks)
	}
	runtime.KeepAlive(y)
	y = nil
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := x.Scan(nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/indexBenchBlocks, "ns/block")
	b.ReportMetric(heap, "heapB/block")
	b.ReportMetric(victimNs, "victims-ns/block")
	b.ReportMetric(float64(len(x.dirs)), "dirs")
}

// BenchmarkIndexRefresh measures a Refresh of an unchanged tree and of one
// with 1% of its leaf directories changed (ns/dir: per directory statted).
func BenchmarkIndexRefresh(b *testing.B) {
	x, leaves := benchIndex(b)
	if err := x.Scan(nil); err != nil {
		b.Fatal(err)
	}
	for _, pct := range []int{0, 1} {
		b.Run(fmt.Sprintf("changed=%d%%", pct), func(b *testing.B) {
			step := len(leaves) // directories changed per refresh: every step-th
			if pct > 0 {
				step = 100 / pct
			}
			round, dirs, changed := 0, 0, 0
			b.ReportAllocs()
			for b.Loop() {
				if pct > 0 {
					b.StopTimer()
					round++
					at := time.Now().Add(-time.Hour).Add(time.Duration(round) * time.Second)
					for i := round % step; i < len(leaves); i += step {
						if err := os.Chtimes(leaves[i], at, at); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
				}
				st, err := x.Refresh()
				if err != nil {
					b.Fatal(err)
				}
				dirs += st.Dirs
				changed += st.Changed
			}
			if pct == 0 && changed != 0 {
				b.Fatalf("an unchanged refresh read %d directories", changed)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(dirs), "ns/dir")
			b.ReportMetric(float64(changed)/float64(b.N), "changed/op")
			b.ReportMetric(float64(dirs)/float64(b.N), "dirs/op")
		})
	}
}

// TestIndexBenchTiny runs the benchmarks' tree builder and a Scan and
// Refresh over a tiny tree, so the benchmark code cannot rot.
func TestIndexBenchTiny(t *testing.T) {
	s := openTestStore(t, Options{})
	x, nsDir := newTestIndex(t, s, "ns")
	leaves := indexTree(t, nsDir, 300, 10)
	assert.Len(t, leaves, 30)
	age(t, allDirs(t, nsDir)...)
	require.NoError(t, x.Scan(nil))
	checkIndex(t, x, 300, 300*64)
	age(t, leaves[:3]...)
	st, err := x.Refresh()
	require.NoError(t, err)
	assert.Equal(t, 3, st.Changed)
}

// errIndexInvariant reports a broken invariant of the index.
var errIndexInvariant = errors.New("blockstore: index invariant")

// checkInvariants verifies the index's bookkeeping: totals match the live
// entries, every directory is in byRel at its position, keys are sorted.
// For tests.
func (x *Index) checkInvariants() error {
	var blocks, size int64
	if len(x.byRel) != len(x.dirs) || len(x.dirs) == 0 || x.dirs[0].rel != "" {
		return fmt.Errorf("%w: %d directories, %d in the map", errIndexInvariant, len(x.dirs), len(x.byRel))
	}
	for i := range x.dirs {
		d := &x.dirs[i]
		if j, ok := x.byRel[d.rel]; !ok || int(j) != i || d.gone {
			return fmt.Errorf("%w: directory %q at %d, map says %d", errIndexInvariant, d.rel, i, j)
		}
		for k := range d.entries {
			if k > 0 && bytes.Compare(d.key(k-1), d.key(k)) >= 0 {
				return fmt.Errorf("%w: directory %q keys out of order at %d", errIndexInvariant, d.rel, k)
			}
		}
		b, n := d.live()
		blocks += b
		size += n
	}
	if b, n := x.Usage(); b != blocks || n != size {
		return fmt.Errorf("%w: usage %d blocks %d bytes, entries hold %d, %d", errIndexInvariant, b, n, blocks, size)
	}
	return nil
}
