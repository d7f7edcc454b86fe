package tier

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/linux_test/noring"
)

// judgeAllAside makes every framed load of the io_uring engine through the
// page cache be judged on a goroutine of its own (as loads of 1 MiB and
// more are on a ring with a spare P) for the rest of the test, tiers of
// openTier load without O_DIRECT, and it counts those Judges.
func judgeAllAside(t *testing.T, hook func()) *atomic.Int64 {
	var n atomic.Int64
	sumAsideAll, testNoDirect = 1, true
	asideStarted = func() {
		n.Add(1)
		if hook != nil {
			hook()
		}
	}
	t.Cleanup(func() { sumAsideAll, asideStarted, testNoDirect = 0, nil, false })
	return &n
}

// TestLoadsJudgedAside runs the load tests of the conformance suite with
// every load judged aside: good blocks load whole, and corrupt ones are
// found and quarantined or left, their next phases prepared by the owner
// once the verdict is in.
func TestLoadsJudgedAside(t *testing.T) {
	n := judgeAllAside(t, nil)
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"TestLoad", TestLoad}, {"TestLoadCorrupt", TestLoadCorrupt}, {"TestBlocksSpanManyChunks", TestBlocksSpanManyChunks},
		{"TestNotRegularAtBlockPath", TestNotRegularAtBlockPath}, {"TestModel", TestModel},
	} {
		before := n.Load()
		t.Run(c.name, c.f)
		// A child without io_uring runs the sync engine alone.
		if _, child := noring.InChild(); !child {
			assert.Greater(t, n.Load(), before, "%s: no load was judged aside", c.name)
		}
	}
}

// TestLoadsInParts runs the load tests of the conformance suite with every
// framed load through the page cache read in parts of 1,000 bytes, each
// checksummed by the Judge of its phase (blockstore.Config.SumChunk): in
// the io_uring engine a phase a submit, the file held in its slot between
// them. Both engines set the parts on a local filesystem, but not an
// owner whose loads are judged aside.
func TestLoadsInParts(t *testing.T) {
	old := sumChunk
	sumChunk, testNoDirect = 1000, true
	t.Cleanup(func() { sumChunk, testNoDirect = old, false })
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"TestLoad", TestLoad}, {"TestLoadCorrupt", TestLoadCorrupt}, {"TestBlocksSpanManyChunks", TestBlocksSpanManyChunks},
		{"TestNotRegularAtBlockPath", TestNotRegularAtBlockPath}, {"TestModel", TestModel},
	} {
		t.Run(c.name, c.f)
	}
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), nil)
		for _, s := range tr.shards {
			switch be := s.be.(type) {
			case *uringBackend:
				assert.Equal(t, 1000, be.cfg.SumChunk)
			case *syncBackend:
				assert.Equal(t, 1000, be.cfg.SumChunk)
			}
		}
	})
	judgeAllAside(t, nil)
	tr := openTier(t, EngineURing, t.TempDir(), nil)
	if be, ok := tr.shards[0].be.(*uringBackend); ok {
		assert.Zero(t, be.cfg.SumChunk, "a load judged aside is checksummed whole, on another CPU")
	}
}

// asideTier opens a one-ring tier whose first load to be judged aside
// waits there until release is closed, having closed started.
func asideTier(t *testing.T, started chan<- struct{}, release <-chan struct{}) *Tier {
	var once atomic.Bool
	judgeAllAside(t, func() {
		if once.CompareAndSwap(false, true) {
			close(started)
			<-release
		}
	})
	tr := openTier(t, EngineURing, t.TempDir(), func(o *Options) { o.Rings = 1 })
	put(t, tr, 0, 1)
	return tr
}

// judging waits for the load to be judged aside.
func judging(t *testing.T, started <-chan struct{}) {
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no load was judged aside")
	}
}

// TestCancelWhileJudgedAside: a Cancel that reaches the owner while a
// load's Judge runs aside touches nothing of the program, and is applied
// once the verdict is in, not lost. A load that has read and verified its
// block reports it loaded; one whose verdict asks for another phase (a
// short file: read again by step) is canceled there, where without the
// cancel it would go on to report the file corrupt.
func TestCancelWhileJudgedAside(t *testing.T) {
	for _, c := range []struct {
		name     string
		truncate bool
		want     Status
	}{{"whole", false, StatusLoaded}, {"short", true, StatusCanceled}} {
		t.Run(c.name, func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			tr := asideTier(t, started, release)
			if c.truncate {
				require.NoError(t, os.Truncate(blockFile(tr, 0), blockstore.HeaderSize+10))
			}
			buf := make([]byte, testBlockSize)
			require.NoError(t, tr.Load(1, testKeys(0), [][]byte{buf}))
			judging(t, started)
			require.True(t, tr.Cancel(1))
			// The owner has taken the cancel in once a lookup after it is answered.
			require.NoError(t, tr.Lookup(2, testKeys(1)))
			assert.Equal(t, []Status{StatusFound}, statuses(await(t, tr, 2)[2]))
			close(release)
			k := await(t, tr, 1)[1].Keys[0]
			require.Equal(t, c.want, k.Status, "%v", k.Err)
			if c.want == StatusLoaded {
				require.Equal(t, testPayload(0), buf)
			} else {
				require.ErrorIs(t, k.Err, ErrCanceled)
			}
			require.NoError(t, tr.Close(context.Background()))
		})
	}
}

// TestRingBreaksWhileJudgedAside: a ring that fails while a load's Judge
// runs aside fails what is in the kernel, and the load judged aside gets
// its own verdict, once, when it comes.
func TestRingBreaksWhileJudgedAside(t *testing.T) {
	armed, fired := faultSubmissions(t)
	started, release := make(chan struct{}), make(chan struct{})
	tr := asideTier(t, started, release)
	buf := make([]byte, testBlockSize)
	require.NoError(t, tr.Load(1, testKeys(0), [][]byte{buf}))
	judging(t, started)
	armed.Store(true)
	require.NoError(t, tr.Load(2, testKeys(1), [][]byte{make([]byte, testBlockSize)}))
	k := await(t, tr, 2)[2].Keys[0]
	require.Equal(t, StatusFailed, k.Status)
	require.ErrorIs(t, k.Err, ErrBroken)
	require.Positive(t, fired.Load(), "the fault was not injected")
	close(release)
	k = awaitWithin(t, tr, 5*time.Second, 1)[1].Keys[0]
	require.Equal(t, StatusLoaded, k.Status, "%v", k.Err)
	require.Equal(t, testPayload(0), buf)
	require.NoError(t, tr.Close(context.Background()))
}
