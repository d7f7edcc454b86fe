package tier

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
)

// TestStoresSync: on a local filesystem the io_uring engine runs stores,
// through the page cache and with O_DIRECT alike, on its store pool, and
// with Options.StoresOnRing on the ring. Page-cache stores on the pool
// hand nothing to the ring; O_DIRECT ones hand it their writes, one SQE a
// store, also to an owner locked to its thread (STATX lookups). Every store stores what a Get reads back, and lookups stay on the
// ring. (TestDirectBypassesPageCache shows the pool's O_DIRECT stores
// leave nothing in the page cache.)
func TestStoresSync(t *testing.T) {
	allRingWrites(t)
	var sqes atomic.Int64
	ringFault = func(n uint32) error {
		sqes.Add(int64(n))
		return nil
	}
	t.Cleanup(func() { ringFault = nil })
	for _, c := range []struct {
		name                  string
		onRing, direct, statx bool
	}{{"pool", false, false, false}, {"onring", true, false, false}, {"direct", false, true, false}, {"direct-statx", false, true, true}} {
		t.Run(c.name, func(t *testing.T) {
			const n = 16
			tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) {
				o.StoresOnRing, o.NoDirect, o.Buffers = c.onRing, !c.direct, n
				if c.statx {
					// Owners locked to their threads; a ring per P, so
					// that they submit through submit (ringFault), not in
					// the io_uring_enter they sleep in with a P to spare.
					o.Lookup, o.Rings = LookupStatx, runtime.GOMAXPROCS(0)
				}
			})
			assert.Equal(t, !c.onRing, tr.Engine().StoresSync)
			assert.Equal(t, c.statx, tr.Engine().OwnThreads)
			if c.direct {
				// Else the case is "pool" again, and would pass with
				// O_DIRECT stores kept on the ring.
				require.True(t, tr.Engine().Direct, "the probe: %s", tr.Engine().NoDirect)
			}
			idx := seq(0, n)
			bufs := tr.Buffers()
			for i := range idx {
				copy(bufs[i], testPayload(i))
			}
			sqes.Store(0)
			require.NoError(t, tr.Store(1, testKeys(idx...), bufs))
			for i, k := range await(t, tr, 1)[1].Keys {
				require.Equal(t, StatusStored, k.Status, "store %d: %v", i, k.Err)
			}
			switch {
			case c.onRing:
				assert.Positive(t, sqes.Load(), "stores on the ring handed it no SQE")
			case c.direct:
				assert.EqualValues(t, n, sqes.Load(), "O_DIRECT stores on the store pool: their writes on the ring")
			default:
				assert.Zero(t, sqes.Load(), "page-cache stores on the store pool handed the ring SQEs")
			}
			for i := range idx {
				got := make([]byte, testBlockSize)
				_, err := tr.BlockStore().Get(tr.Namespace(), testKey(i), got)
				require.NoError(t, err)
				require.Equal(t, testPayload(i), got, "block %d", i)
			}
			sqes.Store(0)
			require.NoError(t, tr.Lookup(2, testKeys(idx...)))
			for i, k := range await(t, tr, 2)[2].Keys {
				require.Equal(t, StatusFound, k.Status, "lookup %d: %v", i, k.Err)
			}
			assert.Positive(t, sqes.Load(), "lookups handed the ring no SQE")
		})
	}
}

// TestStoresOnRing runs the tests that store through the io_uring engine
// with its stores on the rings (Options.StoresOnRing), as on FUSE and NFS,
// rather than on the store pool that runs them on a local filesystem by
// default: none reaches that pool.
func TestStoresOnRing(t *testing.T) {
	testStoresOnRing = true
	t.Cleanup(func() { testStoresOnRing = false })
	pooled := countPooled(t, OpStore)
	for _, c := range []suiteTest{
		{"TestStore", TestStore}, {"TestStoreDirectoryVanished", TestStoreDirectoryVanished},
		{"TestStoreFromBuffers", TestStoreFromBuffers}, {"TestBurstStoresIntoNewDirectories", TestBurstStoresIntoNewDirectories},
		{"TestBlocksSpanManyChunks", TestBlocksSpanManyChunks}, {"TestStoreAfterNamespaceRemoved", TestStoreAfterNamespaceRemoved},
		{"TestStoreAfterFanoutRemoved", TestStoreAfterFanoutRemoved}, {"TestStoreAfterRepeatedRemoval", TestStoreAfterRepeatedRemoval},
		{"TestFileInPlaceOfFanoutDir", TestFileInPlaceOfFanoutDir}, {"TestDirectoryIsAFile", TestDirectoryIsAFile},
		{"TestSymlinkedFanoutDir", TestSymlinkedFanoutDir}, {"TestCapacityFull", TestCapacityFull},
		{"TestCloseWithWorkInFlight", TestCloseWithWorkInFlight}, {"TestDirectBypassesPageCache", TestDirectBypassesPageCache},
		{"TestVLLMRawStore", TestVLLMRawStore}, {"TestModel", TestModel}, {"TestReapUnderPressure", TestReapUnderPressure},
		{"TestLazyWakeTakenIn", TestLazyWakeTakenIn}, {"TestLockedOwnerWithSpareP", TestLockedOwnerWithSpareP},
		{"TestCancel", TestCancel},
	} {
		t.Run(c.name, c.f)
		assert.Zero(t, pooled.Load(), "%s: stores reached the io_uring engine's pool", c.name)
	}
}

// TestStoresWriteOnRing runs the tests that store through the io_uring
// engine with aligned payloads (testAligned): O_DIRECT stores, which its
// store pool runs but for their writes, made on the rings. Each test must
// have made some such writes.
func TestStoresWriteOnRing(t *testing.T) {
	allRingWrites(t)
	testAligned = true
	t.Cleanup(func() { testAligned = false })
	var writes atomic.Int64
	ringWriteAsked = func(*op) { writes.Add(1) }
	t.Cleanup(func() { ringWriteAsked = nil })
	for _, c := range []suiteTest{
		{"TestStore", TestStore}, {"TestStoreDirectoryVanished", TestStoreDirectoryVanished},
		{"TestBurstStoresIntoNewDirectories", TestBurstStoresIntoNewDirectories},
		{"TestStoreAfterNamespaceRemoved", TestStoreAfterNamespaceRemoved},
		{"TestStoreAfterFanoutRemoved", TestStoreAfterFanoutRemoved}, {"TestStoreAfterRepeatedRemoval", TestStoreAfterRepeatedRemoval},
		{"TestFileInPlaceOfFanoutDir", TestFileInPlaceOfFanoutDir}, {"TestDirectoryIsAFile", TestDirectoryIsAFile},
		{"TestCapacityFull", TestCapacityFull}, {"TestModel", TestModel},
	} {
		writes.Store(0)
		t.Run(c.name, c.f)
		assert.Positive(t, writes.Load(), "%s: no store wrote on a ring", c.name)
	}
}

// TestCloseWithRingWritesInFlight closes the tier once the first of 32
// O_DIRECT stores has asked its owner for its write: Close waits for the
// writes on the rings, every store ends stored (or canceled before it
// started), each stored block reads back whole, and no temporary file is
// left.
func TestCloseWithRingWritesInFlight(t *testing.T) {
	allRingWrites(t)
	var writes atomic.Int64
	asked := make(chan struct{})
	ringWriteAsked = func(*op) {
		if writes.Add(1) == 1 {
			close(asked)
		}
	}
	t.Cleanup(func() { ringWriteAsked = nil })
	const n = 32
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Buffers = n })
	require.True(t, tr.Engine().StoresSync && tr.Engine().Direct, "O_DIRECT stores on the store pool: %+v", tr.Engine())
	bufs := tr.Buffers()
	for i := range bufs {
		copy(bufs[i], testPayload(i))
	}
	for i := range n {
		require.NoError(t, tr.Store(uint64(i), testKeys(i), bufs[i:i+1]))
	}
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no store asked for a write on a ring")
	}
	require.NoError(t, tr.Close(context.Background()))
	reqs := make([]uint64, n)
	for i := range reqs {
		reqs[i] = uint64(i)
	}
	stored := 0
	for i, r := range await(t, tr, reqs...) {
		k := r.Keys[0]
		require.Contains(t, []Status{StatusStored, StatusCanceled}, k.Status, "store %d: %v", i, k.Err)
		if k.Status == StatusStored {
			stored++
			got := make([]byte, testBlockSize)
			_, err := tr.BlockStore().Get(tr.Namespace(), testKey(int(i)), got)
			require.NoError(t, err)
			require.Equal(t, testPayload(int(i)), got, "block %d", i)
		}
	}
	assert.Positive(t, stored, "no store finished")
	assertNoTempFiles(t, tr)
}

// allRingWrites has every O_DIRECT store on an io_uring engine's store
// pool make its write on the ring for the rest of the test, however few
// the pool holds (ringWriteMin 0). Called before the test opens a tier.
func allRingWrites(t *testing.T) {
	old := ringWriteMin
	ringWriteMin = 0
	t.Cleanup(func() { ringWriteMin = old })
}

// TestFewStoresWriteThemselves: an O_DIRECT store started while the
// tier's store pools hold ringWriteMin stores or fewer makes its write on
// its worker's thread, and one started while they hold more on the ring:
// of a request of ringWriteMin+3 stores on one ring, all started at once,
// the last 3 write on the ring; a store alone does not. Every block reads
// back whole.
func TestFewStoresWriteThemselves(t *testing.T) {
	var writes atomic.Int64
	ringWriteAsked = func(*op) { writes.Add(1) }
	t.Cleanup(func() { ringWriteAsked = nil })
	require.Positive(t, ringWriteMin)
	n := int(ringWriteMin) + 3
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings, o.Buffers = 1, n })
	require.True(t, tr.Engine().StoresSync && tr.Engine().Direct, "O_DIRECT stores on the store pool: %+v", tr.Engine())
	bufs := tr.Buffers()
	for i := range bufs {
		copy(bufs[i], testPayload(i))
	}
	require.NoError(t, tr.Store(1, testKeys(seq(0, n)...), bufs))
	for i, k := range await(t, tr, 1)[1].Keys {
		require.Equal(t, StatusStored, k.Status, "store %d: %v", i, k.Err)
	}
	assert.EqualValues(t, 3, writes.Load(), "writes on the ring of %d stores started at once", n)
	writes.Store(0)
	require.NoError(t, tr.Store(2, testKeys(n), bufs[:1]))
	require.Equal(t, StatusStored, await(t, tr, 2)[2].Keys[0].Status)
	assert.Zero(t, writes.Load(), "a store alone wrote on the ring")
	for i := range n + 1 {
		got := make([]byte, testBlockSize)
		_, err := tr.BlockStore().Get(tr.Namespace(), testKey(i), got)
		require.NoError(t, err)
		require.Equal(t, testPayload(i%n), got, "block %d", i)
	}
}

// countPooled counts, for the rest of the test, the ops of kind that run
// on an io_uring engine's pool.
func countPooled(t *testing.T, kind Op) *atomic.Int64 {
	var n atomic.Int64
	poolRun = func(o *op, uring bool) {
		if uring && o.kind == kind {
			n.Add(1)
		}
	}
	t.Cleanup(func() { poolRun = nil })
	return &n
}

// TestStuckPooledStore: a store that hangs on the store pool (its worker
// held in a hook, as in a system call that does not return) times out at
// IOTimeout like any stuck op, while lookups and loads on the ring go on;
// Close gives up on it by its context's deadline; once the worker lets go,
// the owner finishes the store and releases the ring.
func TestStuckPooledStore(t *testing.T) {
	release, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	poolRun = func(o *op, uring bool) {
		once.Do(func() {
			close(held)
			<-release
		})
	}
	t.Cleanup(func() { poolRun = nil })
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) {
		o.Rings, o.IOTimeout, o.NoDirect = 1, 100*time.Millisecond, true
	})
	put(t, tr, 1)
	require.NoError(t, tr.Store(1, testKeys(0), [][]byte{testPayload(0)}))
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the store never reached the store pool")
	}
	k := await(t, tr, 1)[1].Keys[0]
	assert.Equal(t, StatusTimedOut, k.Status, "%v", k.Err)
	assert.ErrorIs(t, k.Err, ErrTimeout)
	assert.Equal(t, 1, int(tr.Stats().Stuck))

	buf := make([]byte, testBlockSize)
	require.NoError(t, tr.Lookup(2, testKeys(1)))
	require.NoError(t, tr.Load(3, testKeys(1), [][]byte{buf}))
	res := await(t, tr, 2, 3)
	assert.Equal(t, StatusFound, res[2].Keys[0].Status)
	assert.Equal(t, StatusLoaded, res[3].Keys[0].Status)
	assert.Equal(t, testPayload(1), buf)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	closed := time.Now()
	err := tr.Close(ctx)
	assert.ErrorIs(t, err, ErrStuck)
	assert.ErrorContains(t, err, "1 operations still held")
	assert.Less(t, time.Since(closed), 5*time.Second, "Close waited for the stuck store")
	assert.Equal(t, 1, int(tr.Stats().Stuck), "after Close")
	close(release)
	require.Eventually(t, func() bool { return tr.Stats().Stuck == 0 }, 10*time.Second, time.Millisecond,
		"the owner did not finish the store its worker let go of")
}

// TestLoadsSyncOnTmpfs: on a tmpfs, whose files do not take IOCB_NOWAIT,
// the io_uring engine runs loads on its pool (EngineInfo.LoadsSync), and
// every store, O_DIRECT ones of aligned buffers too: they hand the ring no
// SQE, stores store and loads load what was stored, and a corrupt block is
// found; lookups stay on the ring.
func TestLoadsSyncOnTmpfs(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	var sqes atomic.Int64
	ringFault = func(n uint32) error {
		sqes.Add(int64(n))
		return nil
	}
	t.Cleanup(func() { ringFault = nil })
	tr := openTier(t, EngineURing, dir, func(o *Options) { o.Buffers = 2 })
	require.Equal(t, "tmpfs", tr.Engine().FS)
	assert.True(t, tr.Engine().LoadsSync)
	sqes.Store(0)
	aligned := tr.Buffers()
	copy(aligned[0], testPayload(0))
	copy(aligned[1], testPayload(1))
	require.NoError(t, tr.Store(9, testKeys(0, 1), aligned))
	for i, k := range await(t, tr, 9)[9].Keys {
		require.Equal(t, StatusStored, k.Status, "store %d: %v", i, k.Err)
	}
	assert.Zero(t, sqes.Load(), "stores on the pool handed the ring SQEs (O_DIRECT: %v)", tr.Engine().Direct)
	put(t, tr, 2)
	p := filepath.Join(tr.nsDir, string(tr.BlockStore().Layout().AppendPath(nil, testKey(2))))
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff, 0xee}, blockstore.HeaderSize+100)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	sqes.Store(0)
	bufs := [][]byte{make([]byte, testBlockSize), make([]byte, testBlockSize), make([]byte, testBlockSize)}
	require.NoError(t, tr.Load(1, testKeys(0, 1, 2), bufs))
	res := await(t, tr, 1)[1]
	assert.Zero(t, sqes.Load(), "loads on the pool handed the ring SQEs")
	for i := range 2 {
		require.Equal(t, StatusLoaded, res.Keys[i].Status, "load %d: %v", i, res.Keys[i].Err)
		assert.Equal(t, testPayload(i), bufs[i], "block %d", i)
	}
	assert.Equal(t, StatusCorrupt, res.Keys[2].Status, "%v", res.Keys[2].Err)

	require.NoError(t, tr.Lookup(2, testKeys(0, 1, 3)))
	assert.Equal(t, []Status{StatusFound, StatusFound, StatusMissing}, statuses(await(t, tr, 2)[2]))
	assert.Positive(t, sqes.Load(), "lookups handed the ring no SQE")
}

// TestLoadsOnPool runs the load tests of the suite with the io_uring
// engine's loads on its pool (EngineInfo.LoadsSync), as on tmpfs: each
// test's loads reach that pool.
func TestLoadsOnPool(t *testing.T) {
	testLoadsSync = true
	t.Cleanup(func() { testLoadsSync = false })
	pooled := countPooled(t, OpLoad)
	for _, c := range []suiteTest{
		{"TestLoad", TestLoad}, {"TestLoadCorrupt", TestLoadCorrupt}, {"TestBlocksSpanManyChunks", TestBlocksSpanManyChunks},
		{"TestNotRegularAtBlockPath", TestNotRegularAtBlockPath}, {"TestBurstLoadBiggerThanSQ", TestBurstLoadBiggerThanSQ},
		{"TestDirectBypassesPageCache", TestDirectBypassesPageCache}, {"TestQuarantineLogged", TestQuarantineLogged},
		{"TestVLLMRawCorrupt", TestVLLMRawCorrupt}, {"TestLazyWakeTakenIn", TestLazyWakeTakenIn}, {"TestModel", TestModel},
	} {
		before := pooled.Load()
		t.Run(c.name, c.f)
		assert.Greater(t, pooled.Load(), before, "%s: no load reached the io_uring engine's pool", c.name)
	}
}
