package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/uringtier/uringtier/tier"
)

// workload is what one benchmark run submits: an operation, a batch size,
// and how to fill a batch's keys (and, for stores, its buffers).
type workload struct {
	name  string // lookup, load, store or populate
	op    tier.Op
	batch int
	// fill sets keys[j] (and prepares bufs[j] for a store) for the next
	// len(keys) keys. keys[j] may be kept by the caller: the tier copies
	// keys at submit.
	fill func(keys [][]byte, bufs [][]byte)
}

// limits say when a workload stops submitting: after keys keys if keys > 0,
// else after duration.
type limits struct {
	keys     int64
	duration time.Duration
	progress func(done int64) // called after each polled result; may be nil
}

// inflight is one submitted batch, in the slot its request ID names.
type inflight struct {
	busy  bool
	req   uint64
	start time.Time
	keys  [][]byte
	bufs  [][]byte
}

// drive runs w on tr with depth batches in flight until lim says stop,
// then waits for every batch. bufs are depth × w.batch buffers of the
// tier's block size for loads and stores (nil for lookups). Request IDs
// are seq × depth + slot, so a result names its slot without a map.
func drive(ctx context.Context, tr *tier.Tier, w workload, depth int, bufs [][]byte, lim limits) *result {
	res := &result{Workload: w.name, Batch: w.batch, Depth: depth, BlockSize: tr.BlockSize()}
	st := tr.Stats()
	res.startBusy, res.startShared = st.Busy, st.Shared
	slots := make([]inflight, depth)
	for s := range slots {
		slots[s].keys = make([][]byte, w.batch)
		if bufs != nil {
			slots[s].bufs = bufs[s*w.batch : (s+1)*w.batch]
		}
	}
	results := make([]tier.Result, depth)
	free := make([]int, 0, depth)
	for s := depth - 1; s >= 0; s-- {
		free = append(free, s)
	}
	var (
		seq         uint64
		submitted   int64
		done        int64
		inFlight    int
		firstErr    error
		submitErr   error
		start       = time.Now()
		deadline    = start.Add(lim.duration)
		safety      = time.NewTimer(time.Second)
		interrupted = ctx.Done()
	)
	defer safety.Stop()
	more := func(now time.Time) bool {
		if submitErr != nil || ctx.Err() != nil {
			return false
		}
		if lim.keys > 0 {
			return submitted < lim.keys
		}
		return now.Before(deadline)
	}
	observe := func(longest *time.Duration, d time.Duration) {
		*longest = max(*longest, d)
		res.callerMax = max(res.callerMax, d)
	}
	for {
		for len(free) > 0 && more(time.Now()) {
			s := free[len(free)-1]
			sl := &slots[s]
			n := w.batch
			if lim.keys > 0 {
				n = int(min(int64(n), lim.keys-submitted))
			}
			keys := sl.keys[:n]
			var b [][]byte
			if sl.bufs != nil {
				b = sl.bufs[:n]
			}
			w.fill(keys, b)
			req := seq*uint64(depth) + uint64(s)
			t0 := time.Now()
			var err error
			switch w.op {
			case tier.OpLookup:
				err = tr.Lookup(req, keys)
			case tier.OpLoad:
				err = tr.Load(req, keys, b)
			case tier.OpStore:
				err = tr.Store(req, keys, b)
			}
			observe(&res.submitMax, time.Since(t0))
			if errors.Is(err, tier.ErrBusy) {
				break // the tier's depth is full: poll first
			}
			if err != nil {
				submitErr = fmt.Errorf("%s: submit: %w", w.name, err)
				break
			}
			free = free[:len(free)-1]
			sl.busy, sl.req, sl.start = true, req, t0
			seq++
			inFlight++
			submitted += int64(n)
		}
		if inFlight == 0 && (!more(time.Now()) || len(free) == 0) {
			if len(free) == 0 && submitErr == nil {
				submitErr = fmt.Errorf("%s: every batch's buffers are held by a filesystem that does not answer", w.name)
			}
			break
		}
		safety.Reset(time.Second)
		select {
		case <-tr.Ready():
		case <-safety.C:
		case <-interrupted:
			// Interrupted: cancel what is in flight and drain it.
			interrupted = nil
			for s := range slots {
				if slots[s].busy {
					tr.Cancel(slots[s].req)
				}
			}
		}
		for {
			t0 := time.Now()
			n := tr.Poll(results)
			now := time.Now()
			observe(&res.pollMax, now.Sub(t0))
			if n == 0 {
				break
			}
			for _, r := range results[:n] {
				if r.Op == tier.OpRelease {
					continue // a timed-out batch's buffers came back; its slot is free already
				}
				s := int(r.Req % uint64(depth))
				sl := &slots[s]
				if !sl.busy {
					panic(fmt.Sprintf("tierbench: result for request %d in idle slot %d", r.Req, s))
				}
				res.latencies = append(res.latencies, now.Sub(sl.start))
				res.Batches++
				for j, k := range r.Keys {
					res.Keys++
					switch {
					case k.Status == tier.StatusMissing || k.Status == tier.StatusSkipped:
						res.Missing++
					case k.Status.OK():
						res.Found++
						if w.op != tier.OpLookup {
							res.bytes += int64(res.BlockSize)
						}
					default:
						res.Errors++
						if firstErr == nil {
							firstErr = fmt.Errorf("%s: key %x: %w", k.Status, sl.keys[j], k.Err)
						}
					}
				}
				done += int64(len(r.Keys))
				sl.busy = false
				inFlight--
				if r.Held == 0 {
					free = append(free, s)
				}
				// else the kernel still holds this batch's buffers (a hung
				// filesystem): the slot is never reused.
			}
			if lim.progress != nil {
				lim.progress(done)
			}
		}
	}
	res.elapsed = time.Since(start)
	st = tr.Stats()
	res.Busy, res.Shared = st.Busy-res.startBusy, st.Shared-res.startShared
	switch {
	case submitErr != nil:
		res.FirstError = submitErr.Error()
		res.Errors++
	case firstErr != nil:
		res.FirstError = firstErr.Error()
	}
	res.finish()
	return res
}
