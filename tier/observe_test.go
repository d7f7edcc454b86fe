package tier

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/linux_test/noring"
	"github.com/uringtier/uringtier/uring"
)

// logRecorder is a slog.Handler that keeps every record, for tests.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
	attrs   []slog.Attr // from WithAttrs; shared by the handlers it returns
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.records = append(h.records, r)
	return nil
}

func (h *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attrs = append(h.attrs, attrs...)
	return h
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

// messages returns the messages logged so far.
func (h *logRecorder) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var m []string
	for _, r := range h.records {
		m = append(m, r.Message)
	}
	return m
}

// find returns the attributes of the first record whose message contains
// msg, and whether there is one.
func (h *logRecorder) find(msg string) (slog.Level, map[string]string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if strings.Contains(r.Message, msg) {
			attrs := map[string]string{}
			r.Attrs(func(a slog.Attr) bool {
				attrs[a.Key] = a.Value.String()
				return true
			})
			return r.Level, attrs, true
		}
	}
	return 0, nil, false
}

// TestLogsStateChangesOnly runs lookups, loads and stores of many keys,
// some failing, and checks that the log has the engine's lines from Open
// and nothing else: nothing per key or per request. It checks the counters
// the run moves too.
func TestLogsStateChangesOnly(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		rec := &logRecorder{}
		dir := t.TempDir()
		tr := openTier(t, kind, dir, func(o *Options) { o.Logger = slog.New(rec) })
		_, attrs, ok := rec.find("tier: engine")
		require.True(t, ok, "no engine line: %q", rec.messages())
		assert.Equal(t, kind.String(), attrs["engine"])
		assert.Equal(t, filepath.Join(dir, "default"), attrs["dir"])
		assert.Contains(t, attrs["why"], "asked for")
		if _, _, ok := rec.find("O_DIRECT"); !ok {
			_, attrs, ok := rec.find("page cache")
			require.True(t, ok, "no O_DIRECT line: %q", rec.messages())
			assert.NotEmpty(t, attrs["why"])
		}
		opened := len(rec.messages())
		require.Equal(t, 2, opened, "Open logs the engine and O_DIRECT: %q", rec.messages())

		const n = 64
		put(t, tr, 0, 1, 2, 3)
		keys := make([][]byte, n)
		bufs := make([][]byte, n)
		for i := range keys {
			keys[i] = testKey(i)
			bufs[i] = testPayload(1000 + i)
		}
		require.NoError(t, tr.Lookup(1, keys))
		require.NoError(t, tr.Load(2, keys[:8], bufs[:8]))
		await(t, tr, 1, 2)
		require.NoError(t, tr.Store(3, keys[8:], bufs[8:]))
		await(t, tr, 3)
		assert.Equal(t, opened, len(rec.messages()), "lines after Open: %q", rec.messages()[opened:])

		st := tr.Stats()
		// Each ring counts its own keys; Stats adds them up.
		assert.Equal(t, uint64(4), st.Outcomes[OpLookup][StatusFound])
		assert.Equal(t, uint64(n-4), st.Outcomes[OpLookup][StatusMissing])
		assert.Equal(t, uint64(n), st.Latency[OpLookup].Total(), "one op a key")
		assert.Equal(t, uint64(4*testBlockSize), st.BytesRead, "4 blocks loaded")
		assert.Equal(t, uint64((n-8)*testBlockSize), st.BytesWritten)
		for _, op := range []Op{OpLookup, OpLoad, OpStore} {
			assert.Equal(t, uint64(1), st.RequestLatency[op].Total(), "%v: one request", op)
			assert.Positive(t, st.RequestLatency[op].Quantile(0.5), "%v", op)
			assert.Equal(t, st.Latency[op].Total(), st.QueueWait[op].Total(), "%v: every op waited and ran", op)
			assert.LessOrEqual(t, st.Latency[op].Max(), st.RequestLatency[op].Max()+st.RequestLatency[op].Max()/32,
				"%v: an op took longer than its request", op)
		}
	})
}

// mountFaultFS mounts a faultfs pass-through over a fresh directory, unmounted when t ends.
func mountFaultFS(t *testing.T) *faultfs.FS {
	t.Helper()
	if err := faultfs.Available(); err != nil {
		t.Skipf("needs FUSE: %v", err)
	}
	fsys, err := faultfs.Mount(t.TempDir(), t.TempDir(), faultfs.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, fsys.Unmount()) })
	return fsys
}

// TestLogBreaker hangs a FUSE filesystem under a tier with a breaker
// threshold of 2: the breaker opens, which the log says once, with the
// stuck count; once the hang ends and a probe is answered, the breaker
// closes, which the log says too.
func TestLogBreaker(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		fsys := mountFaultFS(t)
		rec := &logRecorder{}
		tr, err := Open(fsys.Mountpoint(), Options{
			BlockSize: testBlockSize, Engine: kind, Rings: 1, OpsMax: 16, BreakerThreshold: 2,
			LookupTimeout: 100 * time.Millisecond, IOTimeout: 100 * time.Millisecond, Logger: slog.New(rec),
		})
		require.NoError(t, err)
		defer tr.Close(context.Background())
		hang, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpAll, Hang: true})
		require.NoError(t, err)
		defer hang.Release()

		require.NoError(t, tr.Lookup(1, testKeys(0, 1, 2, 3)))
		for _, k := range await(t, tr, 1)[1].Keys {
			require.Equal(t, StatusTimedOut, k.Status)
		}
		require.Eventually(t, func() bool { return tr.Gauges().BreakerOpen }, 5*time.Second, time.Millisecond)
		// The hang holds the stuck operations: the levels stay put, and
		// Stats has the same.
		g := tr.Gauges()
		assert.GreaterOrEqual(t, g.Stuck, 2)
		assert.GreaterOrEqual(t, g.InFlight, g.Stuck)
		assert.Equal(t, g, tr.Stats().Gauges)
		level, attrs, ok := rec.find("circuit breaker open")
		require.True(t, ok, "no breaker line: %q", rec.messages())
		assert.Equal(t, slog.LevelWarn, level)
		assert.Equal(t, "0", attrs["shard"])
		assert.Equal(t, "2", attrs["threshold"])
		stuck, err := strconv.Atoi(attrs["stuck"])
		require.NoError(t, err)
		assert.GreaterOrEqual(t, stuck, 2)
		assert.Positive(t, hang.Fired(), "the hang did not reach the filesystem")

		hang.Release()
		require.Eventually(t, func() bool { return tr.Gauges().Stuck == 0 }, 10*time.Second, time.Millisecond)
		require.NoError(t, tr.Lookup(2, testKeys(9))) // the probe
		assert.Equal(t, StatusMissing, await(t, tr, 2)[2].Keys[0].Status)
		require.Equal(t, Gauges{}, tr.Gauges(), "the breaker stayed open after a probe was answered, or operations stayed in flight")
		level, _, ok = rec.find("circuit breaker closed")
		require.True(t, ok, "no line for the breaker closing: %q", rec.messages())
		assert.Equal(t, slog.LevelInfo, level)
		assert.Equal(t, uint64(1), tr.Stats().BreakerTrips)
	})
}

// TestLogFallback opens EngineAuto in a child process whose seccomp filter
// makes io_uring_setup fail with EPERM: the log says the tier fell back to
// the sync engine and why, as EngineInfo.Fallback does.
func TestLogFallback(t *testing.T) {
	if mode, ok := noring.InChild(); ok {
		require.Equal(t, noring.ModeEPERM, mode)
		rec := &logRecorder{}
		tr, err := Open(t.TempDir(), Options{BlockSize: testBlockSize, Logger: slog.New(rec)})
		require.NoError(t, err)
		require.NoError(t, tr.Close(context.Background()))
		require.Equal(t, EngineSync, tr.Engine().Kind)
		level, attrs, ok := rec.find("falling back to the sync engine")
		require.True(t, ok, "no fallback line: %q", rec.messages())
		assert.Equal(t, slog.LevelWarn, level)
		assert.Equal(t, uring.Available().Error(), attrs["reason"])
		_, attrs, ok = rec.find("tier: engine")
		require.True(t, ok)
		assert.Equal(t, "sync", attrs["engine"])
		assert.Contains(t, attrs["why"], "io_uring is unusable")
		return
	}
	t.Setenv(EngineEnv, "") // the child must choose by itself
	noring.Run(t, noring.ModeEPERM, t.Name())
}

// TestNoteQuarantine checks what the engines' call after a quarantine move
// (or a removal) does: it counts moves and failed moves, logs the first at
// once with both paths and the cause, and then at most a line per
// quarantineLogGap, which counts the quarantines it did not log.
func TestNoteQuarantine(t *testing.T) {
	rec := &logRecorder{}
	tr := openTier(t, EngineSync, t.TempDir(), func(o *Options) { o.Logger = slog.New(rec) })
	cause := syscall.EBADMSG
	tr.noteDisposed(blockstore.Disposal{Action: blockstore.CorruptQuarantine, Rel: []byte("ab/cd/x.blk\x00\x00"), Dst: []byte("/q/default.ab.1\x00"), Err: nil}, cause)
	tr.noteDisposed(blockstore.Disposal{Action: blockstore.CorruptQuarantine, Rel: []byte("ab/cd/y.blk\x00"), Dst: []byte("/q/default.ab.2\x00"), Err: nil}, cause)
	tr.noteDisposed(blockstore.Disposal{Action: blockstore.CorruptQuarantine, Rel: []byte("ab/cd/z.blk\x00"), Dst: []byte("/q/default.ab.3\x00"), Err: syscall.EXDEV}, cause)
	st := tr.Stats()
	assert.Equal(t, uint64(2), st.Quarantined)
	assert.Equal(t, uint64(1), st.QuarantineFailed)
	level, attrs, ok := rec.find("quarantine")
	require.True(t, ok, "no quarantine line: %q", rec.messages())
	assert.Equal(t, slog.LevelWarn, level)
	assert.Equal(t, filepath.Join(tr.nsDir, "ab/cd/x.blk"), attrs["path"])
	assert.Equal(t, "/q/default.ab.1", attrs["quarantine"])
	assert.Equal(t, cause.Error(), attrs["cause"])
	assert.Equal(t, "0", attrs["unlogged"])
	assert.Len(t, rec.messages(), 3, "more than one quarantine line within a second: %q", rec.messages())

	tr.stats.quarantineLogAt.Add(-int64(quarantineLogGap)) // as if a second had passed
	tr.noteDisposed(blockstore.Disposal{Action: blockstore.CorruptQuarantine, Rel: []byte("ab/cd/w.blk\x00"), Dst: []byte("/q/default.ab.4\x00"), Err: syscall.EXDEV}, cause)
	require.Len(t, rec.messages(), 4)
	rec.mu.Lock()
	last := rec.records[3]
	rec.mu.Unlock()
	assert.Equal(t, slog.LevelError, last.Level)
	last.Attrs(func(a slog.Attr) bool {
		if a.Key == "unlogged" {
			assert.Equal(t, "2", a.Value.String())
		}
		return true
	})

	// A removal: counted apart, logged without a quarantine path.
	tr.stats.quarantineLogAt.Add(-int64(quarantineLogGap))
	tr.noteDisposed(blockstore.Disposal{Action: blockstore.CorruptRemove, Rel: []byte("ab/cd/v.blk\x00")}, cause)
	st = tr.Stats()
	assert.Equal(t, uint64(1), st.Removed)
	assert.Equal(t, uint64(2), st.Quarantined, "a removal counted as a quarantine")
	level, attrs, ok = rec.find("removed")
	require.True(t, ok, "no removal line: %q", rec.messages())
	assert.Equal(t, slog.LevelWarn, level)
	assert.Equal(t, filepath.Join(tr.nsDir, "ab/cd/v.blk"), attrs["path"])
	assert.NotContains(t, attrs, "quarantine")
}

// TestFailureClasses stores into a FUSE filesystem that answers every write
// with ENOSPC: the keys end StatusFull, and Stats counts them as
// FailureNoSpace.
func TestFailureClasses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Failure
	}{
		{&os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}, FailureNoSpace},
		{&os.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT}, FailureNoSpace},
		{syscall.EROFS, FailureReadOnly},
		{syscall.EACCES, FailurePermission},
		{syscall.EIO, FailureIO},
		{syscall.ESTALE, FailureStale},
		{syscall.EINVAL, FailureOther},
		{ErrTimeout, FailureOther},
	} {
		assert.Equal(t, c.want, ClassifyFailure(c.err), "%v", c.err)
	}
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		fsys := mountFaultFS(t)
		tr, err := Open(fsys.Mountpoint(), Options{BlockSize: testBlockSize, Engine: kind, Rings: 1})
		require.NoError(t, err)
		defer tr.Close(context.Background())
		rule, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpWrite, Errno: syscall.ENOSPC})
		require.NoError(t, err)
		require.NoError(t, tr.Store(1, testKeys(0, 1), [][]byte{testPayload(0), testPayload(1)}))
		for _, k := range await(t, tr, 1)[1].Keys {
			require.Equal(t, StatusFull, k.Status)
			require.ErrorIs(t, k.Err, syscall.ENOSPC)
		}
		assert.Positive(t, rule.Fired())
		st := tr.Stats()
		assert.Equal(t, uint64(2), st.Failures[OpStore][FailureNoSpace])
		assert.Zero(t, st.BytesWritten)
	})
}

// TestLookupsInFlightBounded: lookups that the filesystem does not answer
// (a FUSE LOOKUP that hangs) hold at most lookupsMax op slots of their
// ring, the rest of a batch waiting queued, and a load submitted after
// them still gets a slot; once the filesystem answers, every key does.
// (The sync engine's lookups are bounded by its workers alone.)
func TestLookupsInFlightBounded(t *testing.T) {
	fsys := mountFaultFS(t)
	tr, err := Open(fsys.Mountpoint(), Options{BlockSize: testBlockSize, Engine: EngineURing, Rings: 1, OpsMax: 1024})
	require.NoError(t, err)
	defer tr.Close(context.Background())
	hang, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpLookup | faultfs.OpGetattr, Hang: true})
	require.NoError(t, err)
	defer hang.Release()

	idx := make([]int, 2*lookupsMax)
	for i := range idx {
		idx[i] = i
	}
	require.NoError(t, tr.Lookup(1, testKeys(idx...)))
	require.Eventually(t, func() bool { return tr.Stats().InFlight == lookupsMax }, 10*time.Second, time.Millisecond,
		"in flight: %d", tr.Stats().InFlight)
	require.NoError(t, tr.Load(2, testKeys(len(idx)), [][]byte{make([]byte, testBlockSize)}))
	require.Eventually(t, func() bool { return tr.Stats().InFlight == lookupsMax+1 }, 10*time.Second, time.Millisecond,
		"the load got no slot: in flight %d", tr.Stats().InFlight)
	require.Eventually(t, func() bool { return hang.Fired() > 0 }, 10*time.Second, time.Millisecond,
		"the hang did not reach the filesystem")

	hang.Release()
	res := await(t, tr, 1, 2)
	assert.Equal(t, StatusMissing, res[2].Keys[0].Status)
	for i, k := range res[1].Keys {
		require.Equal(t, StatusMissing, k.Status, "key %d", i)
	}
}

// TestSyncWorkerHoldsOneOpOnFUSE: on FUSE a sync engine worker takes one
// op at a time, so a lookup that hangs in the filesystem holds no other:
// the rest of its request is answered while it hangs. (On a local
// filesystem workers take several, syncTake.)
func TestSyncWorkerHoldsOneOpOnFUSE(t *testing.T) {
	fsys := mountFaultFS(t)
	tr, err := Open(fsys.Mountpoint(), Options{BlockSize: testBlockSize, Engine: EngineSync, SyncWorkers: 2})
	require.NoError(t, err)
	defer tr.Close(context.Background())
	rel, err := filepath.Rel(fsys.Mountpoint(), tr.nsDir)
	require.NoError(t, err)
	fanout := func(k []byte) string {
		p := string(tr.BlockStore().Layout().AppendPath(nil, k))
		return p[:strings.IndexByte(p, '/')]
	}
	// The hung key's fan-out directory is looked up by it alone; it comes
	// amid the request, where many ops are queued.
	hung := testKey(0)
	var keys [][]byte
	for i := 1; len(keys) < 256; i++ {
		if k := testKey(i); fanout(k) != fanout(hung) {
			keys = append(keys, k)
		}
	}
	keys = slices.Insert(keys, 100, hung)
	hang, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpLookup, Path: rel + "/" + fanout(hung), Hang: true})
	require.NoError(t, err)
	defer hang.Release()

	require.NoError(t, tr.Lookup(1, keys))
	require.Eventually(t, func() bool { return hang.Fired() > 0 }, 10*time.Second, time.Millisecond,
		"the hang did not reach the filesystem")
	require.Eventually(t, func() bool { return tr.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond,
		"ops held behind the hung one: %d in flight", tr.Stats().InFlight)
	hang.Release()
	for i, k := range await(t, tr, 1)[1].Keys {
		require.Equal(t, StatusMissing, k.Status, "key %d", i)
	}
}

// TestRawSubmitOnlyLocal: the rings of a tier on a local filesystem submit
// with raw system calls (uring.Options.RawSubmit), those of a tier on FUSE
// do not: there a file's last close, run inside the submit, may wait for
// the server, and a raw call that sleeps holds its P all along.
func TestRawSubmitOnlyLocal(t *testing.T) {
	if err := uring.Available(); err != nil {
		t.Skipf("needs io_uring: %v", err)
	}
	fsys := mountFaultFS(t)
	for _, c := range []struct {
		dir   string
		local bool
	}{{t.TempDir(), true}, {fsys.Mountpoint(), false}} {
		tr, err := Open(c.dir, Options{BlockSize: testBlockSize, Engine: EngineURing, Rings: 2})
		require.NoError(t, err)
		require.Equal(t, c.local, tr.Engine().Inline, "filesystem %s", tr.Engine().FS)
		require.Len(t, tr.shards, 2)
		for _, s := range tr.shards {
			assert.Equal(t, c.local, s.be.(*uringBackend).ring.RawSubmit(), "filesystem %s, ring %d", tr.Engine().FS, s.idx)
		}
		require.NoError(t, tr.Close(context.Background()))
	}
}
