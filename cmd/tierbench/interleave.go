package main

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/uringtier/uringtier/tier"
)

// runInterleaved runs the named workloads on a tier of each engine in
// kinds, open at once (--interleave): each workload's measured stretch in
// --interleave slices per engine, the engines taking turns slice by slice
// (the first of a round first, then the other first, and so on), so that
// both meet the machine and the filesystem as they are in the same
// seconds. Each slice waits for its batches, and an engine's row adds its
// slices up. The warm-up runs before the first slice, on each engine.
func (s *session) runInterleaved(ctx context.Context, kinds []tier.EngineKind, names []string) (out []*result, err error) {
	trs := make([]*tier.Tier, 0, len(kinds))
	defer func() {
		for _, tr := range trs {
			err = errors.Join(err, closeTier(tr))
		}
	}()
	for _, kind := range kinds {
		tr, err := s.openFor(kind, names)
		if err != nil {
			return nil, err
		}
		trs = append(trs, tr)
	}
	n := int64(s.c.interleave)
	evs := make([]evictions, len(trs))
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		op, depth := workloadOps[name], s.depthFor(name)
		lim := s.limits()
		var stopped string
		if name == "store" {
			lim.room = s.room(name, &stopped)
		}
		ws, bufs := make([]workload, len(trs)), make([][][]byte, len(trs))
		for i, tr := range trs {
			ws[i] = s.newWorkload(name)
			if op != tier.OpLookup {
				bufs[i] = tr.Buffers()
			}
			if warm := s.warmup(name); warm > 0 {
				drive(ctx, tr, ws[i], depth, bufs[i], limits{duration: warm, room: lim.room})
			}
		}
		slice := limits{duration: lim.duration / time.Duration(n), room: lim.room}
		parts := make([][]*result, len(trs))
		order := make([]int, len(trs))
		for i := range order {
			order[i] = i
		}
		for j := range n {
			if lim.keys > 0 {
				// The keys split evenly, the first slices taking the rest.
				slice.keys = lim.keys / n
				if j < lim.keys%n {
					slice.keys++
				}
			}
			for _, i := range order {
				collect() // as before any measured stretch: the last slice's garbage is not this one's
				r := drive(ctx, trs[i], ws[i], depth, bufs[i], slice)
				if sliceRan != nil {
					sliceRan(kinds[i].String(), r)
				}
				parts[i] = append(parts[i], r)
			}
			slices.Reverse(order)
		}
		for i, tr := range trs {
			r := addSlices(parts[i])
			s.label(r, tr.Engine())
			r.Stopped = stopped
			evs[i].note(r, tr)
			out = append(out, r)
			s.emit(r)
		}
		if name == "store" {
			s.m.Blocks = max(s.m.Blocks, s.storeBase+s.stored)
		}
	}
	return out, nil
}

// sliceRan, when set (by tests), is called after each slice with its
// engine and result.
var sliceRan func(engine string, r *result)
