package linux_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
)

const (
	// hungTimeout is every key's deadline in the hung-filesystem test.
	hungTimeout = 200 * time.Millisecond
	// callMax bounds a submit or Poll call: a bound on "does not block", far below the hang (which
	// lasts until released) and the deadline; not a speed claim.
	callMax = 50 * time.Millisecond
	// lateMax is how long after its deadline a timed-out result may arrive, with slack for -race
	// on two loaded cores.
	lateMax = time.Second
)

// timedCall runs f and fails t if it took callMax or longer.
func timedCall(t *testing.T, what string, f func() error) {
	t.Helper()
	start := time.Now()
	err := f()
	d := time.Since(start)
	require.NoError(t, err, what)
	require.Less(t, d, callMax, "%s blocked for %v", what, d)
}

// hungResults polls tr until every request in want has reported, timing each Poll, and returns the
// Results with the time each arrived.
func hungResults(t *testing.T, tr *tier.Tier, want ...uint64) (map[uint64]tier.Result, map[uint64]time.Time) {
	t.Helper()
	got, at := map[uint64]tier.Result{}, map[uint64]time.Time{}
	buf := make([]tier.Result, 8)
	deadline := time.After(20 * time.Second)
	for len(got) < len(want) {
		select {
		case <-tr.Ready():
		case <-time.After(5 * time.Millisecond):
		case <-deadline:
			require.FailNow(t, "timed out waiting for results", "have %d of %d", len(got), len(want))
		}
		for {
			start := time.Now()
			n := tr.Poll(buf)
			d := time.Since(start)
			require.Less(t, d, callMax, "Poll blocked for %v", d)
			if n == 0 {
				break
			}
			for _, r := range buf[:n] {
				if r.Op == tier.OpRelease {
					continue
				}
				r.Keys = append([]tier.KeyResult(nil), r.Keys...)
				got[r.Req], at[r.Req] = r, time.Now()
			}
		}
	}
	return got, at
}

// TestHungFilesystem makes every operation of a faultfs mount hang, with two tiers on it (A and B)
// and one on a healthy directory (C), for each engine:
//   - submits and polls stay non-blocking (each call under callMax);
//   - every key of lookups, loads and stores ends StatusTimedOut (ErrTimeout) at its deadline, and
//     loads and stores report the buffers the kernel still holds (Result.Held);
//   - the breaker opens (BreakerOpen, BreakerTrips >= 1) and new keys fail fast with
//     ErrBreakerOpen, but for one probe;
//   - tier C keeps storing, looking up and loading meanwhile;
//   - Close of A with a short deadline returns by it with an error wrapping ErrStuck that counts
//     the stuck operations;
//   - after the hang is released, B absorbs the late completions: Late grows, Stuck returns to 0,
//     OpRelease Results arrive for the held buffers, and the breaker closes after a probe succeeds.
//     A, closed, gets its late completions too, without a crash.
func TestHungFilesystem(t *testing.T) {
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		fsys := mountFaultFS(t)
		const threshold = 8
		mod := func(o *tier.Options) {
			o.Rings, o.OpsMax = 1, 64 // one shard: one breaker, counts that add up exactly
			o.LookupTimeout, o.IOTimeout = hungTimeout, hungTimeout
			o.BreakerThreshold = threshold
		}
		a := openTier(t, kind, fsys.Mountpoint(), mod)
		b := openTier(t, kind, fsys.Mountpoint(), mod)
		for i := range 40 {
			require.NoError(t, b.BlockStore().Put(b.Namespace(), key(i), payload(i, blockSize)))
		}
		hang, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpAll, Hang: true})
		require.NoError(t, err)
		defer hang.Release()

		// 20 lookups, 4 loads, 4 stores on each of A and B: 28 operations each, all hung.
		const lookups, loads, stores = 20, 4, 4
		const ops = lookups + loads + stores
		loadBufs := map[*tier.Tier][][]byte{a: buffers(loads, blockSize), b: buffers(loads, blockSize)}
		storeBufs := [][]byte{payload(100, blockSize), payload(101, blockSize), payload(102, blockSize), payload(103, blockSize)}
		held := map[*tier.Tier]int{} // buffers held by the kernel, from the Results
		submitted := time.Now()
		for _, tr := range []*tier.Tier{a, b} {
			timedCall(t, "Lookup", func() error { return tr.Lookup(1, keyRange(0, lookups)) })
			timedCall(t, "Load", func() error { return tr.Load(2, keyRange(20, 20+loads), loadBufs[tr]) })
			timedCall(t, "Store", func() error { return tr.Store(3, keyRange(100, 100+stores), storeBufs) })
		}
		var gotB map[uint64]tier.Result
		for name, tr := range map[string]*tier.Tier{"A": a, "B": b} {
			got, at := hungResults(t, tr, 1, 2, 3)
			if tr == b {
				gotB = got
			}
			for req, r := range got {
				late := at[req].Sub(submitted)
				assert.GreaterOrEqual(t, late, hungTimeout-5*time.Millisecond, "%s: request %d answered before its deadline", name, req)
				assert.Less(t, late, hungTimeout+lateMax, "%s: request %d answered long after its deadline", name, req)
				for i, k := range r.Keys {
					require.Equal(t, tier.StatusTimedOut, k.Status, "%s: request %d key %d: %v", name, req, i, k.Err)
					require.ErrorIs(t, k.Err, tier.ErrTimeout, "%s: request %d key %d", name, req, i)
				}
				assert.Zero(t, r.Prefix)
			}
			// An op the kernel had queued but not yet sent to the filesystem (io_uring's worker pool
			// not yet grown) is canceled at its deadline and comes back late at once; every other op
			// is stuck in the filesystem.
			assert.LessOrEqual(t, got[2].Held, loads, "%s: load buffers held", name)
			assert.LessOrEqual(t, got[3].Held, stores, "%s: store buffers held", name)
			held[tr] = got[2].Held + got[3].Held
			var st tier.Stats
			require.Eventually(t, func() bool {
				st = tr.Stats()
				return st.Stuck+int(st.Late) == ops && st.InFlight == st.Stuck
			}, 5*time.Second, time.Millisecond, "%s: every op is stuck or came back late: %+v", name, st)
			t.Logf("%s: %d ops stuck in the filesystem, %d canceled before reaching it; %d buffers held", name, st.Stuck, st.Late, held[tr])
			assert.GreaterOrEqual(t, st.Stuck, threshold, "%s: Stuck", name)
			assert.True(t, st.BreakerOpen, "%s: the breaker did not open with %d stuck", name, st.Stuck)
			assert.Equal(t, uint64(1), st.BreakerTrips, "%s: BreakerTrips", name)
		}
		require.Positive(t, held[b], "B: no load or store buffer is held by the hung filesystem")
		require.Positive(t, hang.Hung(), "nothing hangs in the filesystem")

		// Fail fast: B's next key is the probe (it hangs); every key after it fails at once.
		timedCall(t, "Lookup (probe)", func() error { return b.Lookup(10, keys(30)) })
		time.Sleep(20 * time.Millisecond) // the probe is started before the next request
		fast := time.Now()
		timedCall(t, "Lookup", func() error { return b.Lookup(11, keyRange(31, 40)) })
		timedCall(t, "Load", func() error { return b.Load(12, keys(31, 32), buffers(2, blockSize)) })
		timedCall(t, "Store", func() error { return b.Store(13, keys(110), [][]byte{payload(110, blockSize)}) })
		got, at := hungResults(t, b, 11, 12, 13)
		for req, r := range got {
			assert.Less(t, at[req].Sub(fast), hungTimeout/2, "request %d was not failed fast", req)
			for i, k := range r.Keys {
				require.Equal(t, tier.StatusTimedOut, k.Status, "request %d key %d", req, i)
				require.ErrorIs(t, k.Err, tier.ErrBreakerOpen, "request %d key %d", req, i)
			}
			assert.Zero(t, r.Held, "request %d: nothing reached the kernel", req)
		}
		probe, _ := hungResults(t, b, 10)
		require.ErrorIs(t, probe[10].Keys[0].Err, tier.ErrTimeout, "the probe hung until its deadline")

		// Meanwhile a tier on a healthy directory works.
		c := openTier(t, kind, t.TempDir(), nil)
		require.NoError(t, c.Store(1, keys(0, 1), [][]byte{payload(0, blockSize), payload(1, blockSize)}))
		require.Equal(t, []tier.Status{tier.StatusStored, tier.StatusStored}, statuses(await(t, c, 1)[1]))
		require.NoError(t, c.Lookup(2, keys(0, 1, 2)))
		require.Equal(t, []tier.Status{tier.StatusFound, tier.StatusFound, tier.StatusMissing}, statuses(await(t, c, 2)[2]))
		cbufs := buffers(1, blockSize)
		require.NoError(t, c.Load(3, keys(1), cbufs))
		require.Equal(t, []tier.Status{tier.StatusLoaded}, statuses(await(t, c, 3)[3]))
		require.Equal(t, payload(1, blockSize), cbufs[0])

		// Close A by a short deadline: it returns then, reporting the stuck operations.
		stuckA := a.Stats().Stuck
		const closeWithin = 300 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), closeWithin)
		start := time.Now()
		err = a.Close(ctx)
		took := time.Since(start)
		cancel()
		require.ErrorIs(t, err, tier.ErrStuck)
		require.Contains(t, err.Error(), fmt.Sprintf("%d operations", stuckA), "Close should count the stuck operations")
		assert.GreaterOrEqual(t, took, closeWithin-5*time.Millisecond)
		assert.Less(t, took, closeWithin+lateMax, "Close overstayed its deadline")
		t.Logf("Close after %v: %v", took.Round(time.Millisecond), err)
		require.ErrorIs(t, a.Lookup(99, keys(0)), tier.ErrClosed)

		// Release the hang: B absorbs every late completion.
		lateBefore, stuckB := b.Stats().Late, b.Stats().Stuck
		hang.Release()
		released := map[uint64]bool{}
		buf := make([]tier.Result, 8)
		require.Eventually(t, func() bool {
			for n := b.Poll(buf); n > 0; n = b.Poll(buf) {
				for _, r := range buf[:n] {
					require.Equal(t, tier.OpRelease, r.Op, "request %d reported twice", r.Req)
					released[r.Req] = true
				}
			}
			st := b.Stats()
			return st.Stuck == 0 && st.InFlight == 0 && st.Held == 0 && released[2] == (gotB[2].Held > 0) && released[3] == (gotB[3].Held > 0)
		}, 10*time.Second, 5*time.Millisecond, "B did not absorb the late completions: %+v, released %v", b.Stats(), released)
		st := b.Stats()
		assert.Equal(t, uint64(stuckB), st.Late-lateBefore, "late completions: every stuck op (the probe among them)")
		assert.True(t, st.BreakerOpen, "the breaker closed without a probe")

		// The next key is a probe that succeeds, and the breaker closes.
		require.NoError(t, b.Lookup(20, keys(0)))
		require.Equal(t, []tier.Status{tier.StatusFound}, statuses(await(t, b, 20)[20]))
		assert.False(t, b.Stats().BreakerOpen, "the breaker stayed open after a probe succeeded")
		require.NoError(t, b.Lookup(21, keyRange(0, lookups)))
		for i, s := range statuses(await(t, b, 21)[21]) {
			require.Equal(t, tier.StatusFound, s, "key %d after recovery", i)
		}
		lbufs := buffers(1, blockSize)
		require.NoError(t, b.Load(22, keys(25), lbufs))
		require.Equal(t, []tier.Status{tier.StatusLoaded}, statuses(await(t, b, 22)[22]))
		require.Equal(t, payload(25, blockSize), lbufs[0])
		// The stores released late went through: their blocks are whole.
		verifyClean(t, b.BlockStore(), b.Namespace(), "after the hang")

		// A saw its late completions too, without a crash: after Close it reports nothing but the
		// OpRelease events it owes.
		for n := a.Poll(buf); n > 0; n = a.Poll(buf) {
			for _, r := range buf[:n] {
				assert.Equal(t, tier.OpRelease, r.Op, "a closed tier reported request %d again", r.Req)
			}
		}
		require.True(t, errors.Is(a.Close(context.Background()), tier.ErrStuck), "a second Close returns the first one's result")
	})
}
