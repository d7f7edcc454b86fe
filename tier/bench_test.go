package tier

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/latency"
	"github.com/uringtier/uringtier/uring"
	"golang.org/x/sys/unix"
)

// The benchmarks report keys/s and the caller's time per key inside the
// submit and poll calls (caller-ns/key); BenchmarkLookup, the load and
// store benchmarks also the process's CPU time per key (cpu-ns/key: the
// timed loop's, its fixture's excluded). Fixtures live in one
// directory per benchmark run, written once.

const (
	lookupKeys  = 16384 // half of them present
	lookupBatch = 1024
	bigBlock    = 2 << 20
	bigBlocks   = 48
)

// lookupFixture writes every other key of 0..lookupKeys with 4 KiB blocks.
// It is called by the top-level benchmark, which runs once.
func lookupFixture(b *testing.B) string {
	dir := b.TempDir()
	store, err := blockstore.Open(dir, blockstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 4096)
	for i := 0; i < lookupKeys; i += 2 {
		if err := store.Put("default", testKey(i), payload); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// runBatches keeps inflight requests in flight until total requests have
// finished, calling submit(req, slot) for each, and returns the time spent
// inside submit and Poll. Requests finish in any order; when submit uses
// req as the tier's request ID, slot (0 to inflight-1) is one that no
// request in flight has: a load's buffer, which must be the tier's alone
// until its Result is polled. (Otherwise slot is -1 once inflight requests
// have been submitted.)
func runBatches(b *testing.B, tr *Tier, total, inflight int, submit func(req uint64, slot int) error) time.Duration {
	results := make([]Result, 8)
	free, held := make([]int, 0, inflight), make([]int, total)
	for s := inflight - 1; s >= 0; s-- {
		free = append(free, s)
	}
	var caller time.Duration
	next, done := 0, 0
	for done < total {
		for next < total && next-done < inflight {
			slot := -1
			if len(free) > 0 {
				slot = free[len(free)-1]
			}
			t0 := time.Now()
			err := submit(uint64(next), slot)
			caller += time.Since(t0)
			if err == ErrBusy {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if slot >= 0 {
				free, held[next] = free[:len(free)-1], slot+1
			}
			next++
		}
		t0 := time.Now()
		n := tr.Poll(results)
		caller += time.Since(t0)
		for _, r := range results[:n] {
			for _, k := range r.Keys {
				if k.Status == StatusFailed || k.Status == StatusTimedOut || k.Status == StatusCorrupt {
					b.Fatalf("request %d: %v %v", r.Req, k.Status, k.Err)
				}
			}
			if r.Req < uint64(total) && held[r.Req] > 0 {
				free, held[r.Req] = append(free, held[r.Req]-1), 0
			}
		}
		done += n
		if n == 0 {
			<-tr.Ready()
		}
	}
	return caller
}

// benchTier opens a tier without the lookup cache (BenchmarkLookupCached
// turns it on): the benchmarks measure the filesystem and the engines.
func benchTier(b *testing.B, dir string, kind EngineKind, mod func(*Options)) *Tier {
	opts := Options{BlockSize: 4096, Engine: kind, LookupCacheTTL: -1}
	if mod != nil {
		mod(&opts)
	}
	tr, err := Open(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Close(context.Background()) })
	return tr
}

// benchLookups times lookups of keys through tr, lookupBatch keys a
// request with two in flight, and reports them (reportKeys).
func benchLookups(b *testing.B, tr *Tier, keys [][]byte) {
	b.ReportAllocs()
	var caller time.Duration
	cpu := processCPU(b)
	for b.Loop() {
		caller += runBatches(b, tr, len(keys)/lookupBatch, 2, func(req uint64, _ int) error {
			k := int(req) * lookupBatch
			return tr.Lookup(req, keys[k:k+lookupBatch])
		})
	}
	reportKeys(b, len(keys), caller, cpu)
}

// reportKeys reports a benchmark's keys a second, keys keys a loop, and a
// key's time in the caller's calls and in the process's CPU time (cpu when
// the timed loop began).
func reportKeys(b *testing.B, keys int, caller, cpu time.Duration) {
	n := float64(b.N) * float64(keys)
	b.ReportMetric(n/b.Elapsed().Seconds(), "keys/s")
	b.ReportMetric(float64(caller.Nanoseconds())/n, "caller-ns/key")
	b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/n, "cpu-ns/key")
}

// BenchmarkLookup: 1,024-key batches, half present, warm dentry cache, two
// batches in flight, no lookup cache; against a one-goroutine statx loop
// and a 16-goroutine pool over the same paths.
func BenchmarkLookup(b *testing.B) {
	dir := lookupFixture(b)
	keys := make([][]byte, lookupKeys)
	for i := range keys {
		keys[i] = testKey(i)
	}
	engines := []struct {
		name string
		kind EngineKind
		mod  func(*Options)
	}{
		{"engine=uring-statx/rings=1", EngineURing, func(o *Options) { o.Lookup, o.Rings = LookupStatx, 1 }},
		{"engine=uring-statx/rings=cpus", EngineURing, func(o *Options) { o.Lookup, o.Rings = LookupStatx, runtime.GOMAXPROCS(0) }},
		{"engine=uring-mixed/rings=1", EngineURing, func(o *Options) { o.Lookup, o.Rings = LookupMixed, 1 }},
		{"engine=uring-openpath/rings=1", EngineURing, func(o *Options) { o.Lookup, o.Rings = LookupOpenPath, 1 }},
		{"engine=uring-openpath/rings=cpus", EngineURing, func(o *Options) { o.Lookup, o.Rings = LookupOpenPath, runtime.GOMAXPROCS(0) }},
		{"engine=sync", EngineSync, nil},
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) { benchLookups(b, benchTier(b, dir, e.kind, e.mod), keys) })
	}

	// The plain-syscall baselines: fstatat and faccessat relative to the
	// namespace directory on NUL-terminated paths, allocation-free.
	nsFD, paths := baselinePaths(b, dir, keys)
	calls := []struct {
		name string
		call func(p []byte, st *unix.Stat_t)
	}{
		{"fstatat", fstatat(nsFD)},
		{"faccessat", func(p []byte, _ *unix.Stat_t) {
			unix.Syscall(unix.SYS_FACCESSAT, uintptr(nsFD), uintptr(unsafe.Pointer(&p[0])), unix.F_OK)
		}},
	}
	// The io_uring engine's warm lookup op on bare rings, a ring per CPU,
	// with no tier around it: what the engine could reach with no cost of
	// its own.
	b.Run("engine=ring-openpath/rings=cpus", func(b *testing.B) {
		rings := startRingLookers(b, nsFD, paths, runtime.GOMAXPROCS(0))
		b.ReportAllocs()
		cpu := processCPU(b)
		for b.Loop() {
			rings.run(b)
		}
		reportKeys(b, len(paths), 0, cpu)
	})
	b.Run("engine=fstatat-loop", func(b *testing.B) {
		var st unix.Stat_t
		b.ReportAllocs()
		cpu := processCPU(b)
		for b.Loop() {
			for _, p := range paths {
				calls[0].call(p, &st)
			}
		}
		reportKeys(b, len(paths), 0, cpu)
	})
	for _, c := range calls {
		for _, workers := range []int{2, 16} {
			b.Run(fmt.Sprintf("engine=%s-pool%d", c.name, workers), func(b *testing.B) {
				b.ReportAllocs()
				cpu := processCPU(b)
				for b.Loop() {
					pool(paths, workers, c.call)
				}
				reportKeys(b, len(paths), 0, cpu)
			})
		}
	}
}

// BenchmarkLookupInterleaved times BenchmarkLookup's warm contenders in
// turn, a pass over every key each, the order rotating from round to
// round, so that a VM's drift from minute to minute (2x in keys a second
// between rounds of BenchmarkLookup on a KVM VM) touches them alike. Per
// contender it reports the keys a second and the CPU a key over its own
// passes (NAME-keys/s, NAME-cpu-ns/key). Beside the pools of fstatat and
// faccessat, pools make the bare rings' open as system calls
// (openpath-pool).
func BenchmarkLookupInterleaved(b *testing.B) {
	dir := lookupFixture(b)
	keys := make([][]byte, lookupKeys)
	for i := range keys {
		keys[i] = testKey(i)
	}
	nsFD, paths := baselinePaths(b, dir, keys)
	through := func(tr *Tier) func() {
		return func() {
			runBatches(b, tr, len(keys)/lookupBatch, 2, func(req uint64, _ int) error {
				k := int(req) * lookupBatch
				return tr.Lookup(req, keys[k:k+lookupBatch])
			})
		}
	}
	rings := startRingLookers(b, nsFD, paths, runtime.GOMAXPROCS(0))
	stat := fstatat(nsFD)
	access := func(p []byte, _ *unix.Stat_t) {
		unix.Syscall(unix.SYS_FACCESSAT, uintptr(nsFD), uintptr(unsafe.Pointer(&p[0])), unix.F_OK)
	}
	cs := []contender{
		{name: "uring", pass: through(benchTier(b, dir, EngineURing, func(o *Options) { o.Lookup, o.Rings = LookupOpenPath, runtime.GOMAXPROCS(0) }))},
		{name: "sync", pass: through(benchTier(b, dir, EngineSync, nil))},
		{name: "ring", pass: func() { rings.run(b) }},
		{name: "fstatat-loop", pass: func() {
			var st unix.Stat_t
			for _, p := range paths {
				stat(p, &st)
			}
		}},
	}
	open := openProbe(b, nsFD, stat)
	for _, workers := range []int{2, 16} {
		cs = append(cs,
			contender{name: fmt.Sprintf("fstatat-pool%d", workers), pass: func() { pool(paths, workers, stat) }},
			contender{name: fmt.Sprintf("faccessat-pool%d", workers), pass: func() { pool(paths, workers, access) }},
			contender{name: fmt.Sprintf("openpath-pool%d", workers), pass: func() {
				if n := poolThere(paths, workers, open); n != rings.present {
					b.Fatalf("openpath-pool%d found %d keys of %d there", workers, n, rings.present)
				}
			}})
	}
	inTurn(b, len(keys), cs)
}

// openProbe returns the bare rings' open (blockstore's probe) as a plain
// openat2(2) relative to nsFD: the same op, from a pool of goroutines
// (openpath-pool), where the fastest of the pools (faccessat) asks less
// of the kernel. A path outside the dentry cache (EAGAIN) is asked again
// with uncached, as the bare rings ask fstatat. It reports whether the key
// is there (ENOTDIR), and fails the benchmark on any other answer than the
// probe's two (ENOENT: not there).
func openProbe(b *testing.B, nsFD int, uncached func(p []byte, st *unix.Stat_t)) func(p []byte, st *unix.Stat_t) bool {
	h := *probeHow(b)
	h.Flags |= unix.O_CLOEXEC
	return func(p []byte, st *unix.Stat_t) bool {
		fd, _, e := unix.Syscall6(unix.SYS_OPENAT2, uintptr(nsFD), uintptr(unsafe.Pointer(&p[0])), uintptr(unsafe.Pointer(&h)), unix.SizeofOpenHow, 0, 0)
		switch e {
		case unix.ENOTDIR:
			return true
		case unix.ENOENT:
			return false
		case unix.EAGAIN:
			*st = unix.Stat_t{}
			uncached(p, st)
			return st.Mode&unix.S_IFMT == unix.S_IFREG
		case 0:
			unix.Close(int(fd))
		}
		b.Errorf("openat2 of %s: %v, not the probe's ENOTDIR or ENOENT", p[:len(p)-1], e)
		return false
	}
}

// contender is one of the ways inTurn times: pass does its work once.
type contender struct {
	name      string
	pass      func()
	wall, cpu time.Duration
}

// inTurn times the contenders' passes in turn, the order rotating from
// round to round, and reports each one's keys a second and CPU a key over
// its own passes (NAME-keys/s, NAME-cpu-ns/key), keys keys a pass.
func inTurn(b *testing.B, keys int, cs []contender) {
	round := 0
	for b.Loop() {
		for k := range cs {
			c := &cs[(k+round)%len(cs)]
			t0, cpu := time.Now(), processCPU(b)
			c.pass()
			c.wall += time.Since(t0)
			c.cpu += processCPU(b) - cpu
		}
		round++
	}
	for _, c := range cs {
		n := float64(round) * float64(keys)
		b.ReportMetric(n/c.wall.Seconds(), c.name+"-keys/s")
		b.ReportMetric(float64(c.cpu.Nanoseconds())/n, c.name+"-cpu-ns/key")
	}
}

// BenchmarkSyscall is what entering the kernel costs here: getppid(2) in
// a loop, ns/op. BenchmarkLookup's loops and pools pay it once a key,
// io_uring once a chunk of keys, so their ratio moves with it from host
// to host (docs/performance.md: about 1 µs on a VM whose kernel runs
// with page-table isolation, against the 1.7-3.1 µs of a whole warm
// lookup).
func BenchmarkSyscall(b *testing.B) {
	for b.Loop() {
		unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	}
}

// baselinePaths opens the fixture's namespace directory (closed when b
// ends) and returns it with each key's block path, NUL-terminated.
func baselinePaths(b *testing.B, dir string, keys [][]byte) (int, [][]byte) {
	nsFD, err := unix.Open(filepath.Join(dir, "default"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(nsFD) })
	paths := make([][]byte, len(keys))
	for i := range paths {
		paths[i] = append(blockstore.FanoutLayout{}.AppendPath(nil, keys[i]), 0)
	}
	return nsFD, paths
}

// fstatat returns a call of fstatat(2) relative to nsFD.
func fstatat(nsFD int) func(p []byte, st *unix.Stat_t) {
	return func(p []byte, st *unix.Stat_t) {
		unix.Syscall6(unix.SYS_NEWFSTATAT, uintptr(nsFD), uintptr(unsafe.Pointer(&p[0])), uintptr(unsafe.Pointer(st)), 0, 0, 0)
	}
}

// ringLooker is one thread with a ring of its own that looks up its share
// of paths as the io_uring engine does a warm lookup (LookupOpenPath on a
// local filesystem): blockstore's probe, an O_PATH|O_DIRECTORY open with
// RESOLVE_BENEATH and RESOLVE_CACHED, into a fixed slot, which ends in
// ENOTDIR for a block that is there and ENOENT for one that is not, in
// batches of ringBatch.
type ringLooker struct {
	ring  *uring.Ring
	paths [][]byte
	found int
	err   error
}

type ringLookers struct {
	workers []*ringLooker
	start   []chan struct{}
	done    sync.WaitGroup
	present int // keys present: every other one
}

const ringBatch = 256

// startRingLookers starts n ring threads over the paths split in n,
// stopped at b's cleanup.
func startRingLookers(b *testing.B, nsFD int, paths [][]byte, n int) *ringLookers {
	rl := &ringLookers{present: (len(paths) + 1) / 2}
	how := probeHow(b)
	b.Cleanup(func() {
		for _, c := range rl.start {
			close(c)
		}
	})
	ready := make(chan error)
	for k := range n {
		w := &ringLooker{paths: paths[k*len(paths)/n : (k+1)*len(paths)/n]}
		start := make(chan struct{})
		rl.workers, rl.start = append(rl.workers, w), append(rl.start, start)
		go func() {
			runtime.LockOSThread() // the ring's single issuer
			var err error
			if w.ring, err = uring.New(ringBatch, uring.Options{RawSubmit: true}); err == nil {
				err = w.ring.RegisterFilesSparse(ringBatch)
			}
			ready <- err
			if err != nil {
				return
			}
			defer w.ring.Close()
			cqes := make([]uring.CQE, ringBatch)
			for range start {
				w.found, w.err = 0, nil
				for i := 0; i < len(w.paths) && w.err == nil; i += ringBatch {
					batch := w.paths[i:min(i+ringBatch, len(w.paths))]
					for j, p := range batch {
						sqe := w.ring.GetSQE()
						sqe.PrepareOpenat2Direct(nsFD, &p[0], how, uint32(j))
						sqe.UserData = uint64(j)
					}
					w.lookBatch(nsFD, batch, cqes)
				}
				rl.done.Done()
			}
		}()
		if err := <-ready; err != nil {
			b.Fatal(err)
		}
	}
	return rl
}

// lookBatch submits the prepared opens of batch and reaps their ends. A
// path outside the dentry cache (EAGAIN: the first pass of a short run)
// is asked again with fstatat, as the engine asks STATX.
func (w *ringLooker) lookBatch(nsFD int, batch [][]byte, cqes []uring.CQE) {
	n := len(batch)
	if _, err := w.ring.SubmitAndWait(uint32(n), -1); err != nil {
		w.err = err
		return
	}
	for got := 0; got < n; {
		k := w.ring.Reap(cqes)
		if k == 0 {
			if _, err := w.ring.SubmitAndWait(1, -1); err != nil {
				w.err = err
				return
			}
		}
		for _, c := range cqes[:k] {
			switch unix.Errno(-c.Res) {
			case unix.ENOTDIR:
				w.found++
			case unix.ENOENT:
			case unix.EAGAIN:
				var st unix.Stat_t
				if unix.Fstatat(nsFD, string(batch[c.UserData][:len(batch[c.UserData])-1]), &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
					w.found++
				}
			default:
				w.err = fmt.Errorf("O_PATH open: %w", unix.Errno(-c.Res))
			}
		}
		got += k
	}
}

// run looks every path up once, and fails b unless every look ended as it
// should and found the keys that are there.
func (rl *ringLookers) run(b *testing.B) {
	rl.done.Add(len(rl.workers))
	for _, c := range rl.start {
		c <- struct{}{}
	}
	rl.done.Wait()
	found := 0
	for _, w := range rl.workers {
		if w.err != nil {
			b.Fatal(w.err)
		}
		found += w.found
	}
	if found != rl.present {
		b.Fatalf("found %d keys, want %d", found, rl.present)
	}
}

// pool calls call on every path from workers goroutines.
func pool(paths [][]byte, workers int, call func(p []byte, st *unix.Stat_t)) {
	poolThere(paths, workers, func(p []byte, st *unix.Stat_t) bool { call(p, st); return false })
}

// probeHow is the engine's warm lookup open, as blockstore lays it
// (Program.Probe of a cached-first lookup by open).
func probeHow(b *testing.B) *unix.OpenHow {
	var probe blockstore.Program
	_, how, ok := probe.Probe(&blockstore.Config{Layout: blockstore.FanoutLayout{}, LookupByOpen: true, LookupCachedFirst: true}, testKey(0))
	if !ok {
		b.Fatal("blockstore has no probe for a cached-first lookup by open")
	}
	return how
}

// poolThere is pool for a call that says whether the key is there, and
// returns how many were: each goroutine counts its own.
func poolThere(paths [][]byte, workers int, call func(p []byte, st *unix.Stat_t) bool) int {
	var wg sync.WaitGroup
	counts := make([]int, workers)
	for w := range workers {
		wg.Go(func() {
			var st unix.Stat_t
			n := 0
			for i := w; i < len(paths); i += workers {
				if call(paths[i], &st) {
					n++
				}
			}
			counts[w] = n
		})
	}
	wg.Wait()
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// ioSizes are the block sizes of the load and store benchmarks: a small
// KV-cache block, a middling one and a large one.
var ioSizes = []struct {
	name   string
	size   int
	blocks int
}{{"64KiB", 64 << 10, 512}, {"256KiB", 256 << 10, 192}, {"2MiB", bigBlock, bigBlocks}}

// ioModes: both engines with O_DIRECT, and both through the page cache.
var ioModes = []struct {
	name     string
	noDirect bool
}{{"io=direct", false}, {"io=buffered", true}}

// ioEngines are the engines of the load and store benchmarks: io_uring
// with one ring and with a ring per CPU, and the sync engine; with onRing
// (stores) also the io_uring engine with its stores on its rings
// (Options.StoresOnRing), as it stored before it had a store pool.
func ioEngines(onRing bool) []ioEngine {
	es := []ioEngine{
		{"engine=uring/rings=1", EngineURing, 1, false},
		{"engine=uring/rings=cpus", EngineURing, runtime.GOMAXPROCS(0), false},
		{"engine=sync", EngineSync, 0, false},
	}
	if onRing {
		es = append(es,
			ioEngine{"engine=uring-onring/rings=1", EngineURing, 1, true},
			ioEngine{"engine=uring-onring/rings=cpus", EngineURing, runtime.GOMAXPROCS(0), true})
	}
	return es
}

type ioEngine struct {
	name   string
	kind   EngineKind
	rings  int
	onRing bool // Options.StoresOnRing
}

// processCPU returns the process's user and system CPU time: every
// thread's, io_uring's kernel workers included (they are threads of the
// process), as tierbench's cpu/key counts it.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ioFixture(b *testing.B, size, blocks int) string {
	dir := b.TempDir()
	store, err := blockstore.Open(dir, blockstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 31)
	}
	for i := range blocks {
		if err := store.Put("default", testKey(i), payload); err != nil {
			b.Fatal(err)
		}
	}
	unix.Sync() // an O_DIRECT read of a dirty file would wait for its writeback
	return dir
}

// BenchmarkLoad loads every block of a fixture, one key per request, depth
// 4, into the tier's registered buffers (O_DIRECT where the filesystem
// allows and the engine uses it), for each block size and engine.
func BenchmarkLoad(b *testing.B) {
	for _, sz := range ioSizes {
		dir := ioFixture(b, sz.size, sz.blocks)
		for _, m := range ioModes {
			for _, e := range ioEngines(false) {
				b.Run("size="+sz.name+"/"+m.name+"/"+e.name, func(b *testing.B) {
					const depth = 4
					tr := benchTier(b, dir, e.kind, func(o *Options) {
						o.BlockSize, o.Buffers, o.Rings, o.NoDirect = sz.size, depth, e.rings, m.noDirect
					})
					bufs := tr.Buffers()
					b.SetBytes(int64(sz.size * sz.blocks)) // one loop iteration loads every block
					b.ReportAllocs()
					var caller time.Duration
					cpu := processCPU(b)
					for b.Loop() {
						caller += runBatches(b, tr, sz.blocks, depth, func(req uint64, slot int) error {
							return tr.Load(req, [][]byte{testKey(int(req))}, bufs[slot:slot+1])
						})
					}
					keys := float64(b.N * sz.blocks)
					b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/keys, "cpu-ns/key")
					b.ReportMetric(keys/b.Elapsed().Seconds(), "keys/s")
					b.ReportMetric(float64(caller.Nanoseconds())/keys, "caller-ns/key")
				})
			}
		}
	}
	b.Run("size=2MiB/io=direct/engine=pread/depth=1", func(b *testing.B) {
		dir := ioFixture(b, bigBlock, bigBlocks)
		buf, fds := openBig(b, dir)
		b.SetBytes(bigBlock * bigBlocks)
		for b.Loop() {
			for _, fd := range fds {
				if _, err := unix.Pread(fd, buf, blockstore.HeaderSize); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*bigBlocks)/b.Elapsed().Seconds(), "keys/s")
	})
}

// BenchmarkLoadInterleaved loads every block through the page cache, one
// key a request, 4 in flight, with the io_uring engine (a ring per CPU)
// and the sync engine in turn, a pass each (inTurn), for each block size:
// BenchmarkLoad's io=buffered rows without the VM's drift between them.
func BenchmarkLoadInterleaved(b *testing.B) {
	for _, sz := range ioSizes {
		dir := ioFixture(b, sz.size, sz.blocks)
		b.Run("size="+sz.name, func(b *testing.B) {
			const depth = 4
			through := func(name string, kind EngineKind, rings int) contender {
				tr := benchTier(b, dir, kind, func(o *Options) {
					o.BlockSize, o.Buffers, o.Rings, o.NoDirect = sz.size, depth, rings, true
				})
				bufs := tr.Buffers()
				return contender{name: name, pass: func() {
					runBatches(b, tr, sz.blocks, depth, func(req uint64, slot int) error {
						return tr.Load(req, [][]byte{testKey(int(req))}, bufs[slot:slot+1])
					})
				}}
			}
			inTurn(b, sz.blocks, []contender{through("uring", EngineURing, runtime.GOMAXPROCS(0)), through("sync", EngineSync, 0)})
		})
	}
}

func openBig(b *testing.B, dir string) ([]byte, []int) {
	buf, err := unix.Mmap(-1, 0, bigBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(buf) })
	var fds []int
	for i := range bigBlocks {
		p := filepath.Join(dir, "default", string(blockstore.FanoutLayout{}.AppendPath(nil, testKey(i))))
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		fds = append(fds, fd)
	}
	b.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	return buf, fds
}

// BenchmarkStore stores 16 blocks per loop iteration, one key per
// request, depth 4, into a fresh directory per sub-benchmark, for each
// block size and engine.
func BenchmarkStore(b *testing.B) {
	for _, sz := range ioSizes {
		for _, m := range ioModes {
			for _, e := range ioEngines(true) {
				b.Run("size="+sz.name+"/"+m.name+"/"+e.name, func(b *testing.B) {
					const depth, perRun = 4, 16
					tr := benchTier(b, b.TempDir(), e.kind, func(o *Options) {
						o.BlockSize, o.Buffers, o.Rings, o.NoDirect, o.StoresOnRing = sz.size, depth, e.rings, m.noDirect, e.onRing
					})
					bufs := tr.Buffers()
					b.SetBytes(int64(sz.size * perRun)) // one loop iteration stores perRun blocks
					b.ReportAllocs()
					run := 0
					var caller time.Duration
					cpu := processCPU(b)
					for b.Loop() {
						base := run * perRun
						caller += runBatches(b, tr, perRun, depth, func(req uint64, _ int) error {
							i := int(req)
							return tr.Store(uint64(base+i), [][]byte{testKey(1_000_000 + base + i)}, bufs[i%depth:i%depth+1])
						})
						run++
					}
					keys := float64(b.N * perRun)
					b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/keys, "cpu-ns/key")
					b.ReportMetric(keys/b.Elapsed().Seconds(), "keys/s")
					b.ReportMetric(float64(caller.Nanoseconds())/keys, "caller-ns/key")
				})
			}
		}
	}
}

// BenchmarkDelete deletes blocks in requests of 256 keys, 4 in flight, as
// the evictor and a caller's Delete do; each iteration first stores the
// blocks it deletes (not timed). A delete opens the block's directory and
// unlinks beneath it (see blockstore's program): against an UNLINKAT of the
// path alone, 4 interleaved rounds on 2 CPUs made 0.78-0.90x the keys a
// second with one ring (59-67 k against 71-84 k), 0.76-0.96x with a ring
// per CPU and 0.81-0.93x on the sync engine. It once made 0.27x on one ring:
// the opens completed inline in a submit made mid-way through the batch,
// and their next phase waited out the owner's lazyWake sleep.
func BenchmarkDelete(b *testing.B) {
	const batch, depth = 256, 4
	for _, e := range ioEngines(false) {
		b.Run(e.name, func(b *testing.B) {
			tr := benchTier(b, b.TempDir(), e.kind, func(o *Options) {
				o.BlockSize, o.Rings, o.NoDirect, o.LookupCacheTTL = 4096, e.rings, true, -1
			})
			keys := make([][]byte, depth*batch)
			payload := make([][]byte, len(keys))
			for i := range keys {
				keys[i], payload[i] = testKey(2_000_000+i), make([]byte, 4096)
			}
			var caller time.Duration
			req := uint64(0)
			for b.Loop() {
				b.StopTimer()
				runBatches(b, tr, depth, depth, func(r uint64, _ int) error {
					return tr.Store(req+r, keys[r*batch:(r+1)*batch], payload[r*batch:(r+1)*batch])
				})
				req += depth
				b.StartTimer()
				caller += runBatches(b, tr, depth, depth, func(r uint64, _ int) error { return tr.Delete(req+r, keys[r*batch:(r+1)*batch]) })
				req += depth
			}
			n := float64(b.N * depth * batch)
			b.ReportMetric(n/b.Elapsed().Seconds(), "keys/s")
			b.ReportMetric(float64(caller.Nanoseconds())/n, "caller-ns/key")
		})
	}
}

// bothEngines names each engine, as the sub-benchmarks that compare the
// two with their defaults do.
var bothEngines = []struct {
	name string
	kind EngineKind
}{{"engine=uring", EngineURing}, {"engine=sync", EngineSync}}

// BenchmarkLookupCached asks the same 1,024 keys (half present) again and
// again, as a scheduler asks about a waiting request's prefix every step:
// the lookup cache answers (LookupCacheTTL, a minute here).
func BenchmarkLookupCached(b *testing.B) {
	dir := lookupFixture(b)
	keys := make([][]byte, lookupBatch)
	for i := range keys {
		keys[i] = testKey(i)
	}
	for _, e := range bothEngines {
		b.Run(e.name, func(b *testing.B) {
			tr := benchTier(b, dir, e.kind, func(o *Options) { o.LookupCacheTTL = time.Minute })
			runBatches(b, tr, 1, 1, func(req uint64, _ int) error { return tr.Lookup(req, keys) })
			hits := tr.Stats().CacheHits
			b.ReportAllocs()
			var caller time.Duration
			for b.Loop() {
				caller += runBatches(b, tr, 4, 2, func(req uint64, _ int) error { return tr.Lookup(req, keys) })
			}
			n := float64(b.N) * 4 * lookupBatch
			if got := float64(tr.Stats().CacheHits - hits); got != n {
				b.Fatalf("%.0f of %.0f keys answered from the cache", got, n)
			}
			b.ReportMetric(n/b.Elapsed().Seconds(), "keys/s")
			b.ReportMetric(float64(caller.Nanoseconds())/n, "caller-ns/key")
		})
	}
}

// BenchmarkLookupCachedRoundTrip is one request of 8 keys the lookup
// cache holds at a time, as a scheduler asks about the prefix of a
// waiting request at every step: the call answers it (Tier.answered).
func BenchmarkLookupCachedRoundTrip(b *testing.B) {
	dir := lookupFixture(b)
	keys := testKeys(0, 1, 2, 3, 4, 5, 6, 7)
	for _, e := range bothEngines {
		b.Run(e.name, func(b *testing.B) {
			tr := benchTier(b, dir, e.kind, func(o *Options) { o.LookupCacheTTL = time.Minute })
			results := make([]Result, 1)
			lookup := func() {
				if err := tr.Lookup(1, keys); err != nil {
					b.Fatal(err)
				}
				for tr.Poll(results) == 0 {
					<-tr.Ready()
				}
			}
			lookup()
			hits := tr.Stats().CacheHits
			b.ReportAllocs()
			for b.Loop() {
				lookup()
			}
			n := float64(b.N) * float64(len(keys))
			if got := float64(tr.Stats().CacheHits - hits); got != n {
				b.Fatalf("%.0f of %.0f keys answered from the cache", got, n)
			}
			b.ReportMetric(n/b.Elapsed().Seconds(), "keys/s")
		})
	}
}

// BenchmarkLookupRoundTrip is one request of 8 warm keys at a time: the
// latency a scheduler sees from submit to result.
func BenchmarkLookupRoundTrip(b *testing.B) {
	dir := lookupFixture(b)
	keys := testKeys(0, 1, 2, 3, 4, 5, 6, 7)
	engines := []struct {
		name string
		kind EngineKind
		mod  func(*Options)
	}{
		{"engine=uring/rings=1", EngineURing, func(o *Options) { o.Rings = 1 }},
		{"engine=uring/rings=cpus", EngineURing, func(o *Options) { o.Rings = runtime.GOMAXPROCS(0) }},
		{"engine=uring-statx/rings=cpus", EngineURing, func(o *Options) { o.Lookup, o.Rings = LookupStatx, runtime.GOMAXPROCS(0) }},
		{"engine=sync", EngineSync, nil},
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			tr := benchTier(b, dir, e.kind, e.mod)
			results := make([]Result, 1)
			b.ReportAllocs()
			for b.Loop() {
				if err := tr.Lookup(1, keys); err != nil {
					b.Fatal(err)
				}
				for tr.Poll(results) == 0 {
					<-tr.Ready()
				}
			}
		})
	}
}

// BenchmarkStats: what a look at a tier's figures costs its caller, Stats
// (every counter and histogram) against Gauges (the levels alone), on a
// tier of a ring per CPU that has answered lookups.
func BenchmarkStats(b *testing.B) {
	tr := benchTier(b, lookupFixture(b), EngineURing, func(o *Options) { o.Rings = runtime.GOMAXPROCS(0) })
	if err := tr.Lookup(1, testKeys(seq(0, 1024)...)); err != nil {
		b.Fatal(err)
	}
	for tr.Poll(make([]Result, 1)) == 0 {
		<-tr.Ready()
	}
	b.Run("read=stats", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if tr.Stats().Keys[OpLookup] != 1024 {
				b.Fatal("the lookup's keys are not counted")
			}
		}
	})
	b.Run("read=gauges", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if tr.Gauges().InFlight != 0 {
				b.Fatal("operations in flight after the lookup's result")
			}
		}
	})
}

// BenchmarkLookupCold is BenchmarkLookup after dropping the page, dentry
// and inode caches before every round (root only).
func BenchmarkLookupCold(b *testing.B) {
	if err := dropCaches(); err != nil {
		b.Skipf("cannot drop caches: %v", err)
	}
	dir := lookupFixture(b)
	keys := make([][]byte, lookupKeys)
	for i := range keys {
		keys[i] = testKey(i)
	}
	engines := []struct {
		name string
		kind EngineKind
		mod  func(*Options)
	}{
		{"engine=uring-statx", EngineURing, func(o *Options) { o.Lookup = LookupStatx }},
		{"engine=uring-mixed", EngineURing, func(o *Options) { o.Lookup = LookupMixed }},
		{"engine=uring-openpath", EngineURing, func(o *Options) { o.Lookup = LookupOpenPath }},
		{"engine=sync", EngineSync, nil},
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			tr := benchTier(b, dir, e.kind, e.mod)
			for b.Loop() {
				b.StopTimer()
				if err := dropCaches(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				runBatches(b, tr, lookupKeys/lookupBatch, 2, func(req uint64, _ int) error {
					k := int(req) * lookupBatch
					return tr.Lookup(req, keys[k:k+lookupBatch])
				})
			}
			b.ReportMetric(float64(b.N)*lookupKeys/b.Elapsed().Seconds(), "keys/s")
		})
	}
	// Pools of goroutines calling fstatat over the same paths.
	nsFD, paths := baselinePaths(b, dir, keys)
	for _, workers := range []int{16, 64} {
		b.Run(fmt.Sprintf("engine=fstatat-pool%d", workers), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				if err := dropCaches(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				pool(paths, workers, fstatat(nsFD))
			}
			b.ReportMetric(float64(b.N)*lookupKeys/b.Elapsed().Seconds(), "keys/s")
		})
	}
}

func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// BenchmarkCallerFloor asks where the caller's slowest calls come from.
// The caller keeps four 1,024-key lookup batches in flight, and after each
// Lookup or Poll call it spins on the clock for spinFor, a stretch of pure
// CPU work as long as a typical call: whatever makes the spin's p99.9 long
// (the thread preempted by the owners, kernel workers, interrupts, the Go
// runtime) makes the calls' long too. Reported: p50, p99.9 and the longest
// of the calls, of the Lookup calls alone and of the spins, in µs.
// engine=none spins with no tier at all: the machine's own floor, which no
// call can go below; its calls are spins of callSpin, a Store or Poll
// call's median, and of lookupSpin, a 1,024-key Lookup call's with busy
// owners (its lookup-call figures), in turn, each followed by a long spin.
// testdata/callerfloor runs it beside another process's IO.
// With URINGTIER_CALLER_TRACE set to a file, the caller's thread keeps to
// CPU 0 and every call's start and end (CLOCK_MONOTONIC) go to the file,
// for testdata/callertrace to set beside what perf saw on that CPU.
//
// op=store, op=load: the default run's stores or loads instead (64 KiB,
// O_DIRECT where TMPDIR takes it, 4 batches of 16 in flight); their spins
// are the floor under that IO, which no Store, Load or Poll call can go
// below.
//
// op=idle: one Lookup at a time, 100 µs after the last one's result, as a
// scheduler asks between steps: each call finds the owners asleep and
// wakes them. Its cpu-µs/call is the process's CPU a call and its sleep.
func BenchmarkCallerFloor(b *testing.B) {
	const spinFor, callSpin, lookupSpin = 20 * time.Microsecond, 2500 * time.Nanosecond, 6 * time.Microsecond
	dir := lookupFixture(b)
	keys := testKeys(seq(0, 1024)...)
	spinN := func(d time.Duration) time.Duration {
		t0 := time.Now()
		for time.Since(t0) < d {
		}
		return time.Since(t0)
	}
	spin := func(spins *latency.Counts) { spins.Record(spinN(spinFor)) }
	// poll makes one timed Poll call and a spin after it, waits for results
	// if none came, and returns those it took.
	poll := func(tr *Tier, trace *callTrace, results []Result, calls, spins *latency.Counts) []Result {
		m0, t0 := trace.now(), time.Now()
		n := tr.Poll(results)
		calls.Record(time.Since(t0))
		trace.add('P', m0)
		spin(spins)
		if n == 0 {
			<-tr.Ready()
		}
		return results[:n]
	}
	report := func(b *testing.B, name string, c *latency.Counts) {
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		b.ReportMetric(us(c.Quantile(0.5)), name+"-p50-µs")
		b.ReportMetric(us(c.Quantile(0.999)), name+"-p99.9-µs")
		b.ReportMetric(us(c.Max()), name+"-max-µs")
	}
	b.Run("engine=none", func(b *testing.B) {
		var calls, lookups, spins latency.Counts
		for b.Loop() {
			calls.Record(spinN(callSpin))
			spin(&spins)
			d := spinN(lookupSpin)
			calls.Record(d)
			lookups.Record(d)
			spin(&spins)
		}
		report(b, "call", &calls)
		report(b, "lookup-call", &lookups)
		report(b, "spin", &spins)
	})
	for _, e := range bothEngines {
		b.Run(e.name, func(b *testing.B) {
			trace := callerTrace(b)
			tr := benchTier(b, dir, e.kind, nil)
			var calls, lookups, spins latency.Counts
			results := make([]Result, 8)
			inFlight := 0
			req := uint64(0)
			for b.Loop() {
				for inFlight < 4 {
					req++
					m0, t0 := trace.now(), time.Now()
					err := tr.Lookup(req, keys)
					d := time.Since(t0)
					trace.add('L', m0)
					calls.Record(d)
					lookups.Record(d)
					if err != nil {
						b.Fatal(err)
					}
					inFlight++
					spin(&spins)
				}
				inFlight -= len(poll(tr, trace, results, &calls, &spins))
			}
			report(b, "call", &calls)
			report(b, "lookup-call", &lookups)
			report(b, "spin", &spins)
		})
	}
	// The default run's stores and loads: 64 KiB, batches of 16, 4 in
	// flight; stores over 4,096 keys in turn into an empty directory, loads
	// over a fixture of 512 blocks.
	works := []struct {
		name   string
		kind   byte // the trace's letter
		submit func(t *Tier, req uint64, keys, bufs [][]byte) error
		keys   int
		want   Status
		fixed  bool // the directory holds the blocks (ioFixture)
	}{{"store", 'S', (*Tier).Store, 4096, StatusStored, false}, {"load", 'R', (*Tier).Load, 512, StatusLoaded, true}}
	for _, w := range works {
		for _, e := range bothEngines {
			b.Run("op="+w.name+"/"+e.name, func(b *testing.B) {
				const batch, depth = 16, 4
				trace := callerTrace(b)
				dir := b.TempDir()
				if w.fixed {
					dir = ioFixture(b, 64<<10, w.keys)
				}
				tr := benchTier(b, dir, e.kind, func(o *Options) { o.BlockSize, o.Buffers = 64<<10, batch*depth })
				bufs := tr.Buffers()
				keys := testKeys(seq(0, w.keys)...)
				free := []int{0, 1, 2, 3} // batches of bufs not in flight
				slotOf := map[uint64]int{}
				var calls, ops, spins latency.Counts
				results := make([]Result, depth)
				req := uint64(0)
				for b.Loop() {
					for len(free) > 0 {
						req++
						slot := free[len(free)-1]
						k := int(req*batch) % w.keys
						m0, t0 := trace.now(), time.Now()
						err := w.submit(tr, req, keys[k:k+batch], bufs[slot*batch:(slot+1)*batch])
						d := time.Since(t0)
						trace.add(w.kind, m0)
						calls.Record(d)
						ops.Record(d)
						if err != nil {
							b.Fatal(err)
						}
						free, slotOf[req] = free[:len(free)-1], slot
						spin(&spins)
					}
					for _, r := range poll(tr, trace, results, &calls, &spins) {
						for _, k := range r.Keys {
							if k.Status != w.want {
								b.Fatalf("%s %d: %v %v", w.name, r.Req, k.Status, k.Err)
							}
						}
						free = append(free, slotOf[r.Req])
						delete(slotOf, r.Req)
					}
				}
				report(b, "call", &calls)
				report(b, w.name+"-call", &ops)
				report(b, "spin", &spins)
			})
		}
	}
	for _, e := range bothEngines {
		b.Run("op=idle/"+e.name, func(b *testing.B) {
			tr := benchTier(b, dir, e.kind, nil)
			var lookups latency.Counts
			results := make([]Result, 1)
			req := uint64(0)
			cpu := processCPU(b)
			for b.Loop() {
				req++
				t0 := time.Now()
				err := tr.Lookup(req, keys)
				lookups.Record(time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				for tr.Poll(results) == 0 {
					<-tr.Ready()
				}
				time.Sleep(100 * time.Microsecond)
			}
			report(b, "lookup-call", &lookups)
			b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/call")
		})
	}
}

// callTrace records calls as "L|S|R|P start end" lines (Lookup, Store,
// Load, Poll; CLOCK_MONOTONIC nanoseconds); a nil one records nothing.
type callTrace struct{ lines []byte }

// callerTrace returns a trace if URINGTIER_CALLER_TRACE names a file, which
// it writes when b ends, and keeps b's goroutine on CPU 0 until then.
func callerTrace(b *testing.B) *callTrace {
	path := os.Getenv("URINGTIER_CALLER_TRACE")
	if path == "" {
		return nil
	}
	runtime.LockOSThread()
	var was, cpu0 unix.CPUSet
	cpu0.Set(0)
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		b.Fatal(err)
	}
	if err := unix.SchedSetaffinity(0, &cpu0); err != nil {
		b.Fatal(err)
	}
	c := &callTrace{}
	b.Cleanup(func() {
		unix.SchedSetaffinity(0, &was)
		runtime.UnlockOSThread()
		if err := os.WriteFile(path, c.lines, 0o644); err != nil {
			b.Error(err)
		}
	})
	return c
}

func (c *callTrace) now() int64 {
	if c == nil {
		return 0
	}
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (c *callTrace) add(kind byte, start int64) {
	if c != nil {
		c.lines = fmt.Appendf(c.lines, "%c %d %d\n", kind, start, c.now())
	}
}

// seq returns from, from+1, …, to-1.
func seq(from, to int) []int {
	s := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}
