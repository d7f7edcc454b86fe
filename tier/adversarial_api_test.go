package tier

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/linux_test/noring"
)

// span is a range of mapped addresses, [lo, hi).
type span struct{ lo, hi uint64 }

// privateMappings returns the address ranges this process has mapped
// private and read-write, as the tier's buffers are, from /proc/self/maps.
// Leaving out the rest leaves out most of what new threads map meanwhile:
// glibc reserves 64 MiB malloc arenas without access.
func privateMappings(t *testing.T) []span {
	t.Helper()
	data, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	var spans []span
	for line := range strings.Lines(string(data)) {
		var s span
		var perms string
		_, err := fmt.Sscanf(line, "%x-%x %s", &s.lo, &s.hi, &perms)
		require.NoError(t, err, "/proc/self/maps line %q", line)
		if perms == "rw-p" {
			spans = append(spans, s)
		}
	}
	return spans
}

// newlyMapped returns how many bytes are mapped in after but were not in
// before. It counts address space, not mappings: the kernel merges an
// anonymous mapping with a compatible neighbour (the race detector's, a
// thread stack), so a buffer mapping need not show up as a line of its own.
func newlyMapped(before, after []span) uint64 {
	var n uint64
	for _, a := range after {
		n += a.hi - a.lo
		for _, b := range before {
			if lo, hi := max(a.lo, b.lo), min(a.hi, b.hi); lo < hi {
				n -= hi - lo
			}
		}
	}
	return n
}

// openFDs returns how many descriptors this process has open.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

// lowerNoFile lowers RLIMIT_NOFILE for the rest of the test, so that a
// fixed-file table of 4,096 slots cannot be registered.
func lowerNoFile(t *testing.T) {
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &old))
	low := old
	low.Cur = min(1024, old.Max)
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
	t.Cleanup(func() { require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &old)) })
}

// TestFailedOpenReleasesBuffers opens a tier with 256 MiB of buffers where
// the io_uring engine cannot start (in a child without io_uring: it is
// unavailable; elsewhere: its ring set-up fails half-way on RLIMIT_NOFILE)
// and checks that the failed Open leaves neither the mapping nor a
// descriptor behind.
func TestFailedOpenReleasesBuffers(t *testing.T) {
	// Large enough to stand out from what the runtime maps meanwhile (an
	// 8 MiB stack for each new thread); never touched, so it costs address
	// space only.
	const blockSize, buffers = 64 << 10, 4096
	const size = blockSize * buffers
	dir := t.TempDir()

	// The measure must see the buffers while a tier holds them.
	before := privateMappings(t)
	tr, err := Open(dir, Options{BlockSize: blockSize, Engine: EngineSync, Buffers: buffers})
	require.NoError(t, err)
	require.GreaterOrEqual(t, newlyMapped(before, privateMappings(t)), uint64(size), "an open tier's buffers do not show in /proc/self/maps")
	require.NoError(t, tr.Close(context.Background()))

	opts := Options{BlockSize: blockSize, Engine: EngineURing, Rings: 2, Buffers: buffers}
	want := "IORING_REGISTER_FILES2"
	if _, ok := noring.InChild(); ok {
		want = "engine uring"
	} else {
		lowerNoFile(t)
		opts.OpsMax = 4096
	}
	fds := openFDs(t)
	before = privateMappings(t)
	tr, err = Open(dir, opts)
	require.ErrorContains(t, err, want)
	assert.Nil(t, tr)
	assert.Less(t, newlyMapped(before, privateMappings(t)), uint64(size/2), "a failed Open left its buffers mapped")
	assert.Equal(t, fds, openFDs(t), "a failed Open left descriptors open")
}

// TestDirectoryIsAFile puts a regular file where the namespace directory
// belongs, then where a fan-out directory belongs. Open refuses the first
// on both engines with ENOTDIR naming the file (the sync engine used to
// accept it: blockstore took mkdir's EEXIST for "the directory exists");
// a store into the second fails with ENOTDIR, and succeeds once the file
// is gone.
func TestDirectoryIsAFile(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		dir := t.TempDir()
		ns := filepath.Join(dir, "default")
		require.NoError(t, os.WriteFile(ns, nil, 0o644))
		tr, err := Open(dir, Options{BlockSize: testBlockSize, Engine: kind})
		if tr != nil {
			tr.Close(context.Background())
		}
		require.ErrorIs(t, err, unix.ENOTDIR)
		var pe *fs.PathError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, ns, pe.Path)
		require.NoError(t, os.Remove(ns))

		tr = openTier(t, kind, dir, nil)
		fanout := string(tr.BlockStore().Layout().AppendDir(nil, testKey(0)))
		obstacle := filepath.Join(tr.nsDir, fanout[:strings.IndexByte(fanout, '/')])
		require.NoError(t, os.WriteFile(obstacle, nil, 0o644))
		buf := testPayload(0)
		require.NoError(t, tr.Store(1, testKeys(0), [][]byte{buf}))
		k := await(t, tr, 1)[1].Keys[0]
		assert.Equal(t, StatusFailed, k.Status)
		assert.ErrorIs(t, k.Err, unix.ENOTDIR)
		assert.ErrorContains(t, k.Err, obstacle)
		require.NoError(t, os.Remove(obstacle))
		require.NoError(t, tr.Store(2, testKeys(0), [][]byte{buf}))
		assert.Equal(t, []Status{StatusStored}, statuses(await(t, tr, 2)[2]))
	})
}

// TestAfterClose checks what a closed tier answers: ErrClosed for every
// submit, also one that is invalid besides, and Stats with nothing queued
// or in flight, also when Close found requests waiting for op slots.
func TestAfterClose(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		// One op slot and 8 requests of 256 keys: most keys wait in the
		// owner's queue when Close comes. Where the owner is when Close
		// comes varies, so try a few times.
		keys := make([][]byte, 256)
		for i := range keys {
			keys[i] = testKey(i % 3)
		}
		var tr *Tier
		for round := range 10 {
			var err error
			tr, err = Open(t.TempDir(), Options{BlockSize: testBlockSize, Engine: kind, Rings: 1, OpsMax: 1, BatchMax: len(keys)})
			require.NoError(t, err)
			put(t, tr, 0)
			var reqs []uint64
			for req := uint64(1); req <= 8; req++ {
				require.NoError(t, tr.Lookup(req, keys))
				reqs = append(reqs, req)
			}
			require.NoError(t, tr.Close(context.Background()))
			st := tr.Stats()
			require.Zero(t, st.Queued, "round %d: requests queued after Close", round)
			require.Zero(t, st.InFlight, "round %d: operations in flight after Close", round)
			await(t, tr, reqs...)
		}

		buf := make([]byte, testBlockSize)
		for _, c := range []struct {
			name string
			err  error
		}{
			{"valid lookup", tr.Lookup(1, testKeys(1))},
			{"short key", tr.Lookup(1, [][]byte{[]byte("short")})},
			{"nil key", tr.LookupPrefix(1, [][]byte{nil})},
			{"too many keys", tr.Lookup(1, make([][]byte, len(keys)+1))},
			{"small buffer", tr.Load(1, testKeys(1), [][]byte{buf[:100]})},
			{"buffer count", tr.Load(1, testKeys(1, 2), [][]byte{buf})},
			{"large buffer", tr.Store(1, testKeys(1), [][]byte{append(buf, 0)})},
			{"no buffers", tr.Store(1, testKeys(1), nil)},
		} {
			assert.ErrorIs(t, c.err, ErrClosed, c.name)
			assert.NotErrorIs(t, c.err, ErrInvalid, c.name)
		}
	})
}

// TestBuffersDuringClose calls Buffers from several goroutines while Close
// unmaps the buffers: the race detector must find nothing, and a closed
// tier returns no buffers.
func TestBuffersDuringClose(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr, err := Open(t.TempDir(), Options{BlockSize: testBlockSize, Engine: kind, Buffers: 4})
		require.NoError(t, err)
		require.Len(t, tr.Buffers(), 4)
		var stop atomic.Bool
		var wrong atomic.Int64 // calls that returned neither the buffers nor nil
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					if b := tr.Buffers(); b != nil && len(b) != 4 {
						wrong.Add(1)
					}
					// Without yielding, the race detector missed the
					// race in most runs; with it, in none of 20.
					runtime.Gosched()
				}
			}()
		}
		require.NoError(t, tr.Close(context.Background()))
		stop.Store(true)
		wg.Wait()
		assert.Zero(t, wrong.Load())
		assert.Nil(t, tr.Buffers(), "buffers of a closed tier")
	})
}
