package tier

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
)

// kernelCQE is a completion as the kernel posts it: step and result.
type kernelCQE struct {
	step int
	res  int32
}

// postedCQEs models what the kernel posts for p's phase when step fail
// (-1: none) fails with failRes and every other step succeeds in full,
// the steps in skips carrying IOSQE_CQE_SKIP_SUCCESS. The rules, which
// uring.TestCQESkipLinks checks against the kernel: a step posts unless
// it succeeded with the flag; a LinkOnSuccess step that fails cancels the
// rest of its chain, whose steps post -ECANCELED (whatever their flags)
// unless the failed step carried the flag, in which case none posts.
func postedCQEs(p *blockstore.Program, skips uint16, fail int, failRes int32) []kernelCQE {
	var out []kernelCQE
	canceled, quiet := false, false
	for k := range p.N {
		st := &p.Steps[k]
		skip := skips&(1<<k) != 0
		switch {
		case canceled && !quiet:
			out = append(out, kernelCQE{k, -int32(unix.ECANCELED)})
		case canceled:
		case k == fail:
			out = append(out, kernelCQE{k, failRes})
			if st.Link == blockstore.LinkOnSuccess {
				canceled, quiet = true, skip
			}
		case !skip:
			out = append(out, kernelCQE{k, int32(st.Asked())})
		}
		if st.Link == blockstore.LinkNone {
			canceled, quiet = false, false
		}
	}
	return out
}

// failures returns the results step st may fail with: errors that lead
// the programs down their other paths, and a short read or write.
func failures(st *blockstore.Step) []int32 {
	errs := []int32{-int32(unix.ENOENT), -int32(unix.EIO)}
	if n := int32(st.Asked()); n > 0 {
		errs = append(errs, n-1)
	}
	return errs
}

// TestCQESkipCompletes checks complete against the kernel's rules: for
// every phase of every program, reached through up to three phases of
// failures, and every failure of each of its steps (or none), the
// completions posted with cqeSkips' flags leave the same results, phase
// end and all, as every step posting its own (as the engine had it before
// it skipped any). And a store that succeeds posts one completion.
func TestCQESkipCompletes(t *testing.T) {
	old := blockstore.RWMax
	blockstore.RWMax = 16 << 10 // loads and stores of 64 KiB in chunks
	t.Cleanup(func() { blockstore.RWMax = old })
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i)
	}
	type program struct {
		name   string
		op     blockstore.Op
		format blockstore.Format
		dur    blockstore.Durability
		size   int
		direct bool
		byOpen bool
	}
	var programs []program
	for _, f := range []blockstore.Format{blockstore.FormatFramed, blockstore.FormatRaw} {
		for _, d := range []blockstore.Durability{blockstore.DurabilityNone, blockstore.DurabilityData, blockstore.DurabilityFull} {
			programs = append(programs, program{fmt.Sprintf("store/%v/%v", f, d), blockstore.OpStore, f, d, 4096, false, false})
		}
		for _, size := range []int{4096, 64 << 10} {
			for _, direct := range []bool{false, true} {
				programs = append(programs, program{fmt.Sprintf("load/%v/%d/direct=%v", f, size, direct), blockstore.OpLoad, f, 0, size, direct, false})
			}
		}
		programs = append(programs, program{fmt.Sprintf("store/%v/64k", f), blockstore.OpStore, f, 0, 64 << 10, false, false})
	}
	programs = append(programs,
		program{"lookup/statx", blockstore.OpLookup, 0, 0, 0, false, false},
		program{"lookup/open", blockstore.OpLookup, 0, 0, 0, false, true},
		program{"delete", blockstore.OpDelete, 0, 0, 0, false, false})

	type choice struct {
		fail int
		res  int32
	}
	for _, pr := range programs {
		t.Run(pr.name, func(t *testing.T) {
			cfg := &blockstore.Config{Layout: blockstore.FanoutLayout{}, Format: pr.format, Durability: pr.dur,
				Dir: "/ns", Quarantine: "/q", Namespace: "ns", LookupByOpen: pr.byOpen}
			phases, skipped := 0, 0
			// start runs the program through the phases path chooses, the
			// kernel posting every completion; false: it decided first.
			start := func(path []choice) (*uringBackend, bool) {
				cfg.Dirs = dirSet{}
				b := &uringBackend{progs: make([]blockstore.Program, 1), await: make([]uint16, 1)}
				p := &b.progs[0]
				buf := make([]byte, pr.size)
				require.NoError(t, p.Start(cfg, pr.op, key, buf, make([]byte, blockstore.ScratchSize), pr.direct))
				for _, c := range path {
					for _, q := range postedCQEs(p, 0, c.fail, c.res) {
						p.Steps[q.step].Res = q.res
					}
					if p.Judge() {
						return b, false
					}
				}
				return b, true
			}
			var walk func(path []choice)
			walk = func(path []choice) {
				b, ok := start(path)
				if !ok {
					return
				}
				p := &b.progs[0]
				phases++
				choices := []choice{{-1, 0}}
				for k := range p.N {
					for _, r := range failures(&p.Steps[k]) {
						choices = append(choices, choice{k, r})
					}
				}
				for _, c := range choices {
					want := postedCQEs(p, 0, c.fail, c.res)
					b.await[0] = 1<<p.N - 1
					for k := range p.N {
						p.Steps[k].Res = 12345 // what complete must overwrite
					}
					got := postedCQEs(p, cqeSkips(p), c.fail, c.res)
					skipped += len(want) - len(got)
					for n, q := range got {
						require.NotZero(t, b.await[0]&(1<<q.step), "%v: a completion for step %d, which has its result", c, q.step)
						done := b.complete(0, q.step, q.res)
						require.Equal(t, n == len(got)-1, done, "%v: the phase ended after completion %d of %d", c, n+1, len(got))
					}
					for _, q := range want {
						require.Equal(t, q.res, p.Steps[q.step].Res, "%v: step %d (%v)", c, q.step, p.Steps[q.step].Op)
					}
					if c.fail < 0 && pr.op == blockstore.OpStore && len(path) == 0 && p.N > 1 {
						require.Len(t, got, 1, "a store's first phase that succeeds posts one completion")
					}
					if len(path) < 3 && c.res != -int32(unix.EIO) {
						walk(append(path[:len(path):len(path)], c))
					}
				}
			}
			walk(nil)
			t.Logf("%d phases, %d completions skipped", phases, skipped)
			if pr.op == blockstore.OpStore {
				require.NotZero(t, skipped)
			}
		})
	}
}
