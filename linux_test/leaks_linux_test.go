package linux_test

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/uringtier/uringtier/tier"
)

// openFDs returns how many descriptors this process has open, and how many of them are io_uring
// instances (anon_inode:[io_uring], see io_uring/io_uring.c, io_uring_get_file).
func openFDs(t *testing.T) (fds, rings int) {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range entries {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the descriptor ReadDir itself used, closed by now
		}
		fds++
		if target == "anon_inode:[io_uring]" {
			rings++
		}
	}
	return fds, rings
}

// TestNoLeaksAfterClose opens a tier, runs lookups, loads and stores through it and closes it: no
// descriptor, io_uring instance or goroutine of it remains.
func TestNoLeaksAfterClose(t *testing.T) {
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		dir := t.TempDir()
		goroutines := goleak.IgnoreCurrent()
		fds0, rings0 := openFDs(t)

		const rings = 3
		tr, err := tier.Open(dir, tier.Options{BlockSize: blockSize, Engine: kind, Rings: rings, Buffers: 2})
		require.NoError(t, err)
		fds, open := openFDs(t)
		if kind == tier.EngineURing {
			// The rings and their descriptors exist once Open returns: the counts can show a leak.
			require.Equal(t, rings0+rings, open, "io_uring instances while open")
			require.Greater(t, fds, fds0, "the tier holds no descriptor: the count cannot show a leak")
		} else {
			require.Equal(t, rings0, open, "the sync engine created a ring")
		}

		bufs := [][]byte{tr.Buffers()[0], payload(1, blockSize)}
		copy(bufs[0], payload(0, blockSize))
		require.NoError(t, tr.Store(1, keys(0, 1), bufs))
		require.NoError(t, tr.Lookup(2, keys(0, 1, 2)))
		await(t, tr, 1, 2)
		lbufs := [][]byte{make([]byte, blockSize), tr.Buffers()[1]}
		require.NoError(t, tr.Load(3, keys(0, 1), lbufs))
		require.Equal(t, []tier.Status{tier.StatusLoaded, tier.StatusLoaded}, statuses(await(t, tr, 3)[3]))
		require.NoError(t, tr.Lookup(4, keys(5, 6)))
		require.NoError(t, tr.Close(context.Background()))
		await(t, tr, 4)

		fds1, rings1 := openFDs(t)
		assert.Equal(t, fds0, fds1, "descriptors after Close")
		assert.Equal(t, rings0, rings1, "io_uring instances after Close")
		goleak.VerifyNone(t, goroutines)
	})
}

// TestMillionLookupsBoundedMemory runs a million lookups (batches of 4096, four requests in
// flight, a key space of 1024 with one key in 16 present, no lookup cache) and checks that the heap
// in use grows by less than heapGrowthMax from after the first batches to the end: memory follows
// the depth, not the number of keys seen.
func TestMillionLookupsBoundedMemory(t *testing.T) {
	const (
		total         = 1 << 20
		batch         = 4096
		inflight      = 4
		keySpace      = 1024
		heapGrowthMax = 4 << 20
	)
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		tr := openTier(t, kind, t.TempDir(), func(o *tier.Options) { o.OpsMax = 1024 })
		for i := 0; i < keySpace; i += 16 {
			require.NoError(t, tr.BlockStore().Put(tr.Namespace(), key(i), payload(i, blockSize)))
		}
		// Batches are built once and reused: the test's own garbage does not count.
		batches := make([][][]byte, inflight)
		for b := range batches {
			batches[b] = make([][]byte, batch)
			for j := range batch {
				batches[b][j] = key((b*batch + j*7) % keySpace)
			}
		}
		results := make([]tier.Result, inflight)
		for i := range results {
			results[i].Keys = make([]tier.KeyResult, 0, batch)
		}
		found, done, submitted := 0, 0, 0
		var heap0 uint64
		start := time.Now()
		for done < total/batch {
			for submitted-done < inflight && submitted < total/batch {
				require.NoError(t, tr.Lookup(uint64(submitted), batches[submitted%inflight]))
				submitted++
			}
			n := tr.Poll(results)
			if n == 0 {
				<-tr.Ready()
				continue
			}
			for _, r := range results[:n] {
				for _, k := range r.Keys {
					switch k.Status {
					case tier.StatusFound:
						found++
					case tier.StatusMissing:
					default:
						t.Fatalf("request %d: %v %v", r.Req, k.Status, k.Err)
					}
				}
				done++
				if done == 2*inflight {
					heap0 = heapInUse()
				}
			}
		}
		took := time.Since(start)
		heap1 := heapInUse()
		require.Equal(t, total/16, found, "found keys")
		growth := int64(heap1) - int64(heap0)
		t.Logf("%s: %d lookups in %v; heap in use %d KiB after warm-up, %d KiB at the end (growth %d KiB)",
			kind, total, took.Round(time.Millisecond), heap0>>10, heap1>>10, growth>>10)
		assert.Less(t, growth, int64(heapGrowthMax), "heap grew with the number of keys looked up")
	})
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}
