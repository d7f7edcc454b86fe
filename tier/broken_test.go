package tier

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/uring"
)

// faultSubmissions makes every submission that carries SQEs fail with
// EBADFD once armed is set, counting them in fired, for the rest of the
// test. Only those: the owner may also submit nothing on its way to sleep
// just as the fault is armed (seen once in CI), and a test's next op would
// then meet a tier broken before it.
func faultSubmissions(t *testing.T) (armed *atomic.Bool, fired *atomic.Int64) {
	armed, fired = new(atomic.Bool), new(atomic.Int64)
	ringFault = func(sqes uint32) error {
		if armed.Load() && sqes > 0 {
			fired.Add(1)
			return syscall.EBADFD
		}
		return nil
	}
	t.Cleanup(func() { ringFault = nil })
	return armed, fired
}

// TestBrokenRingFailsTheTier makes the kernel refuse a submission with an
// error no retry helps (EBADFD, as for a ring torn down under the tier):
// the process goes on, every key in flight ends StatusFailed wrapping
// ErrBroken and the cause, later submits fail at once, Stats and Engine
// say why, and Close returns. The io_uring engine used to panic.
func TestBrokenRingFailsTheTier(t *testing.T) {
	armed, fired := faultSubmissions(t)
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 1 })
	put(t, tr, 0, 1, 2, 3)
	require.NoError(t, tr.Lookup(1, testKeys(0, 1, 2, 3)))
	assert.Equal(t, []Status{StatusFound, StatusFound, StatusFound, StatusFound}, statuses(await(t, tr, 1)[1]))

	armed.Store(true)
	bufs := [][]byte{make([]byte, testBlockSize), make([]byte, testBlockSize), make([]byte, testBlockSize), make([]byte, testBlockSize)}
	require.NoError(t, tr.Load(2, testKeys(0, 1, 2, 3), bufs))
	for i, k := range await(t, tr, 2)[2].Keys {
		assert.Equal(t, StatusFailed, k.Status, "key %d", i)
		assert.ErrorIs(t, k.Err, ErrBroken, "key %d", i)
		assert.ErrorIs(t, k.Err, syscall.EBADFD, "key %d", i)
	}
	require.Positive(t, fired.Load(), "the fault was not injected")

	err := tr.Lookup(3, testKeys(0))
	require.ErrorIs(t, err, ErrBroken, "a submit after the failure")
	assert.ErrorIs(t, err, syscall.EBADFD)
	assert.Contains(t, tr.Engine().Broken, "engine broken")
	assert.Contains(t, tr.Stats().Engine.Broken, "file descriptor in bad state")
	require.NoError(t, tr.Close(context.Background()))
}

// TestBrokenRingFailsPoolWrites breaks the ring while O_DIRECT stores on
// the store pool wait for their writes on it: each store ends StatusFailed
// wrapping ErrBroken and the cause, none holds a buffer (the kernel took
// none of the writes), no temporary file stays, and Close returns. Without
// the ring's failure answering them, the pool's workers would wait for
// the writes forever.
func TestBrokenRingFailsPoolWrites(t *testing.T) {
	allRingWrites(t)
	armed, fired := faultSubmissions(t)
	const n = 4
	dir := t.TempDir()
	tr := openTier(t, EngineURing, dir, func(o *Options) { o.Rings, o.Buffers, o.NoDirect = 1, n, false })
	require.True(t, tr.Engine().StoresSync && tr.Engine().Direct, "O_DIRECT stores on the store pool: %+v", tr.Engine())
	armed.Store(true)
	bufs := tr.Buffers()
	require.NoError(t, tr.Store(1, testKeys(seq(0, n)...), bufs))
	r := awaitWithin(t, tr, 10*time.Second, 1)[1]
	for i, k := range r.Keys {
		assert.Equal(t, StatusFailed, k.Status, "key %d", i)
		assert.ErrorIs(t, k.Err, ErrBroken, "key %d", i)
		assert.ErrorIs(t, k.Err, syscall.EBADFD, "key %d", i)
	}
	require.Positive(t, fired.Load(), "the fault was not injected")
	assert.Zero(t, r.Held, "the kernel took no write")
	tmps, err := filepath.Glob(filepath.Join(dir, "*", "*", "*", "*.tmp*"))
	require.NoError(t, err)
	assert.Empty(t, tmps, "temporary files left")
	require.ErrorIs(t, tr.Store(2, testKeys(0), bufs[:1]), ErrBroken, "a submit after the failure")
	require.NoError(t, tr.Close(context.Background()))
}

// TestBrokenRingHoldsTakenPoolWrites breaks the ring just after the kernel
// took an O_DIRECT store's write from the store pool (the fault submits for
// real, then fails the submission): the store ends StatusFailed wrapping
// ErrBroken and the cause, and its buffer stays held (Result.Held), since a
// broken ring never reaps the write that may still read it; no temporary
// file stays, and Close returns.
func TestBrokenRingHoldsTakenPoolWrites(t *testing.T) {
	allRingWrites(t)
	var ring atomic.Pointer[uring.Ring] // armed: the ring to break
	var taken atomic.Int64
	ringFault = func(sqes uint32) error {
		r := ring.Load()
		if r == nil || sqes == 0 {
			return nil
		}
		n, err := r.Submit() // on the owner's goroutine, as its own submit would
		if err != nil {
			return err
		}
		taken.Add(int64(n))
		return syscall.EBADFD
	}
	t.Cleanup(func() { ringFault = nil })
	dir := t.TempDir()
	tr := openTier(t, EngineURing, dir, func(o *Options) { o.Rings, o.Buffers, o.NoDirect = 1, 1, false })
	require.True(t, tr.Engine().StoresSync && tr.Engine().Direct, "O_DIRECT stores on the store pool: %+v", tr.Engine())
	ring.Store(tr.shards[0].be.(*uringBackend).ring)
	bufs := tr.Buffers()
	require.NoError(t, tr.Store(1, testKeys(0), bufs))
	r := awaitWithin(t, tr, 10*time.Second, 1)[1]
	require.Equal(t, int64(1), taken.Load(), "the kernel took the write, and nothing else")
	assert.Equal(t, StatusFailed, r.Keys[0].Status)
	assert.ErrorIs(t, r.Keys[0].Err, ErrBroken)
	assert.ErrorIs(t, r.Keys[0].Err, syscall.EBADFD)
	assert.Equal(t, 1, r.Held, "the buffer of the write the kernel took")
	tmps, err := filepath.Glob(filepath.Join(dir, "*", "*", "*", "*.tmp*"))
	require.NoError(t, err)
	assert.Empty(t, tmps, "temporary files left")
	require.NoError(t, tr.Close(context.Background()))
}

// TestRingBreaksMidBatch breaks the ring while its owner is still starting
// a 1,024-key batch of found keys, after three chunks of them completed
// inline and were finished, their op slots taken by the next keys: every key
// gets one result, those of the first chunks found and the rest failed with
// ErrBroken, and no slot is left in use.
func TestRingBreaksMidBatch(t *testing.T) {
	var submits, fired atomic.Int64
	var armed atomic.Bool
	ringFault = func(sqes uint32) error {
		if !armed.Load() || sqes == 0 {
			return nil
		}
		if submits.Add(1) > 3 {
			fired.Add(1)
			return syscall.EBADFD
		}
		return nil
	}
	t.Cleanup(func() { ringFault = nil })
	keys := make([]int, 1024)
	for i := range keys {
		keys[i] = i
	}
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings, o.OpsMax = 1, len(keys) })
	put(t, tr, keys...)
	require.NoError(t, tr.Lookup(1, testKeys(keys...)))
	await(t, tr, 1)

	armed.Store(true)
	require.NoError(t, tr.Lookup(2, testKeys(keys...)))
	found := 0
	for i, k := range await(t, tr, 2)[2].Keys {
		switch k.Status {
		case StatusFound:
			found++
		case StatusFailed:
			assert.ErrorIs(t, k.Err, ErrBroken, "key %d", i)
		default:
			assert.Fail(t, "neither found nor failed", "key %d: %v %v", i, k.Status, k.Err)
		}
	}
	require.Positive(t, fired.Load(), "the fault was not injected")
	assert.Equal(t, 3*submitChunk, found, "keys found before the ring broke")
	require.NoError(t, tr.Close(context.Background()))
	assert.Zero(t, tr.shards[0].inUse, "op slots in use")
}

// TestReapUnderPressure runs a flood of lookups, loads and stores through
// one ring whose queues hold 32 entries each, with 256 ops, so that the SQ
// fills while phases are prepared, and makes every other submission fail
// as the kernel does when it wants completions reaped first (EBUSY; this
// kernel keeps overflowed completions instead, so the refusal is
// injected). Reaping inside a submit used to re-enter the reap loop and
// could handle a completion twice or lose one. Every key must get exactly
// one result (await fails on a second), and the right one.
func TestReapUnderPressure(t *testing.T) {
	ringSize = 32
	var calls atomic.Int64
	ringFault = func(uint32) error {
		if calls.Add(1)%2 == 0 {
			return fmt.Errorf("injected: %w", uring.ErrRetry)
		}
		return nil
	}
	t.Cleanup(func() { ringSize, ringFault = 0, nil })
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings, o.OpsMax = 1, 256 })
	const n = 512
	present := make([]int, 0, n/2)
	for i := 0; i < n; i += 2 {
		present = append(present, i)
	}
	put(t, tr, present...)
	var want []uint64
	for r := range 8 {
		keys := make([][]byte, n)
		for i := range keys {
			keys[i] = testKey(i)
		}
		require.NoError(t, tr.Lookup(uint64(100+r), keys))
		want = append(want, uint64(100+r))
	}
	loadKeys, loadBufs := testKeys(), [][]byte{}
	for _, i := range present[:64] {
		loadKeys, loadBufs = append(loadKeys, testKey(i)), append(loadBufs, make([]byte, testBlockSize))
	}
	require.NoError(t, tr.Load(200, loadKeys, loadBufs))
	storeKeys, storeBufs := testKeys(), [][]byte{}
	for i := n; i < n+64; i++ {
		storeKeys, storeBufs = append(storeKeys, testKey(i)), append(storeBufs, testPayload(i))
	}
	require.NoError(t, tr.Store(300, storeKeys, storeBufs))
	got := await(t, tr, append(want, 200, 300)...)
	for _, id := range want {
		for i, k := range got[id].Keys {
			wantSt := StatusMissing
			if i%2 == 0 {
				wantSt = StatusFound
			}
			require.Equal(t, wantSt, k.Status, "request %d key %d: %v", id, i, k.Err)
		}
	}
	for i, k := range got[200].Keys {
		require.Equal(t, StatusLoaded, k.Status, "load %d: %v", i, k.Err)
		require.Equal(t, testPayload(present[i]), loadBufs[i])
	}
	for i, k := range got[300].Keys {
		require.Equal(t, StatusStored, k.Status, "store %d: %v", i, k.Err)
	}
	require.Positive(t, tr.Stats().SubmitRetries, "no submission was refused")
}

// TestStrayCompletionFailsTheTier: a completion for a step not in flight (a
// step past its phase's last, here) breaks the invariant the owner loop
// asserts: the tier fails with ErrBroken and says why, instead of reading
// past the phase or handling a step twice.
func TestStrayCompletionFailsTheTier(t *testing.T) {
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 1 })
	put(t, tr, 0)
	var once atomic.Bool
	opStarted = func(s *shard) {
		if once.CompareAndSwap(false, true) {
			b := s.be.(*uringBackend)
			sqe := b.sqe()
			sqe.PrepareNop()
			sqe.UserData = ud(0, blockstore.StepsMax-1) // no phase has that many steps in flight
		}
	}
	t.Cleanup(func() { opStarted = nil })
	require.NoError(t, tr.Lookup(1, testKeys(0)))
	await(t, tr, 1)
	require.True(t, once.Load(), "the stray completion was not queued")
	assert.Eventually(t, func() bool { return tr.Engine().Broken != "" }, 5*time.Second, time.Millisecond)
	assert.Contains(t, tr.Engine().Broken, "not a step in flight")
	assert.ErrorIs(t, tr.Lookup(2, testKeys(0)), ErrBroken)
}

// TestBrokenRingKeepsKernelBuffers: a load whose read the kernel took
// (hung in a FUSE filesystem) when the ring broke: its Result fails with
// ErrBroken and counts the buffer in Held, and no OpRelease follows, since
// a broken ring never says when the kernel lets go; the kernel does write
// the buffer once the filesystem answers. It once said Held 0, and the
// caller's cleared buffer was written behind its back.
func TestBrokenRingKeepsKernelBuffers(t *testing.T) {
	armed, fired := faultSubmissions(t)
	fsys := mountFaultFS(t)
	tr, err := Open(fsys.Mountpoint(), Options{BlockSize: testBlockSize, Engine: EngineURing, Rings: 1, OpsMax: 128})
	require.NoError(t, err)
	defer tr.Close(context.Background())
	put(t, tr, 0)
	hang, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpRead, Hang: true,
		// The read of header and payload, into the caller's buffer.
		Filter: func(op faultfs.Op) bool { return op.Offset == 0 && op.Size == blockstore.HeaderSize+testBlockSize }})
	require.NoError(t, err)
	defer hang.Release()

	buf := make([]byte, testBlockSize)
	require.NoError(t, tr.Load(1, testKeys(0), [][]byte{buf}))
	require.Eventually(t, func() bool { return hang.Hung() > 0 }, 5*time.Second, time.Millisecond, "the load did not reach the hang")
	armed.Store(true)
	// A chunk's worth of lookups: the owner submits them, and the fault
	// breaks the ring.
	lk := make([][]byte, 2*submitChunk)
	for i := range lk {
		lk[i] = testKey(100 + i)
	}
	require.NoError(t, tr.Lookup(2, lk))
	got := await(t, tr, 1, 2)
	require.Positive(t, fired.Load(), "the fault was not injected")
	r := got[1]
	require.Equal(t, StatusFailed, r.Keys[0].Status)
	require.ErrorIs(t, r.Keys[0].Err, ErrBroken)
	require.Equal(t, 1, r.Held, "the kernel has the buffer")
	assert.EqualValues(t, 1, tr.Stats().Held)
	assert.Equal(t, 1, tr.Gauges().Held)

	hang.Release()
	require.Eventually(t, func() bool { return bytes.Equal(buf, testPayload(0)) }, 5*time.Second, time.Millisecond,
		"the kernel wrote the buffer once the filesystem answered")
	res := make([]Result, 4)
	for range 20 {
		for _, d := range res[:tr.Poll(res)] {
			require.NotEqual(t, OpRelease, d.Op, "an OpRelease for request %d from a broken ring", d.Req)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, tr.Close(ctx))
}
