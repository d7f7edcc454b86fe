package tier

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
)

// EngineKind selects how the tier issues IO.
type EngineKind uint8

// Engines.
const (
	EngineAuto  EngineKind = iota // io_uring when usable here, else sync; URINGTIER_ENGINE overrides
	EngineURing                   // io_uring; Open fails, saying why, where it is unusable
	EngineSync                    // plain syscalls on a bounded pool of goroutines
)

// String returns "auto", "uring" or "sync".
func (e EngineKind) String() string {
	switch e {
	case EngineAuto:
		return "auto"
	case EngineURing:
		return "uring"
	case EngineSync:
		return "sync"
	}
	return fmt.Sprintf("EngineKind(%d)", uint8(e))
}

// ParseEngine parses "auto", "uring" or "sync".
func ParseEngine(s string) (EngineKind, error) {
	switch s {
	case "auto", "":
		return EngineAuto, nil
	case "uring":
		return EngineURing, nil
	case "sync":
		return EngineSync, nil
	}
	return 0, fmt.Errorf("%w: engine %q (want auto, uring or sync)", ErrInvalidOptions, s)
}

// EngineEnv is the environment variable that overrides EngineAuto.
const EngineEnv = "URINGTIER_ENGINE"

// LookupOp selects the kernel operation behind an io_uring lookup.
type LookupOp uint8

// Lookup operations. Measured on 2 CPUs, ext4 on virtio, 16,384 paths half
// present, 1,024-key batches, a ring per CPU, medians of four interleaved
// runs (BenchmarkLookup): O_PATH 0.56 M keys/s, STATX 0.40 M (0.31 M on
// one ring), mixed (one ring) 0.34 M, a pool of 16 goroutines calling
// fstatat 0.61 M; a round trip of 8 keys (BenchmarkLookupRoundTrip) took
// 23–26 µs by O_PATH and 87–98 µs by STATX on one ring (an earlier week).
const (
	// LookupOpenPath, the default, opens the file with O_PATH into a
	// fixed-file slot, where the next open replaces it (no CLOSE per
	// lookup): the kernel answers it inline, in the owner's thread, when
	// the path is in the dentry cache. On a local filesystem the open is
	// RESOLVE_CACHED and O_DIRECTORY, so that a block found ends it in
	// ENOTDIR with no file made (1.17x the keys a second of an O_PATH
	// open that makes one, BenchmarkLookup, a ring per CPU, 5 interleaved
	// rounds), and a path the cache cannot resolve is asked again
	// by STATX, in a kernel worker (caches dropped, BenchmarkLookupCold,
	// 6 interleaved rounds: 1.25x a pool of 64 goroutines calling
	// fstatat at the median, against 1.05x for the O_PATH open handed to
	// a worker). A ring whose opens the cache has not answered 64 times
	// more than four times as often as it has (64 in a row, caches
	// dropped) asks STATX at once, all but one lookup in 16 (1.06x the
	// keys a second of an open first, 10 interleaved rounds, caches
	// dropped), until two such probes in a row are answered from the
	// cache. Elsewhere the open itself goes to a kernel worker.
	LookupOpenPath LookupOp = iota
	// LookupStatx issues STATX, which always runs in a kernel worker.
	LookupStatx
	// LookupMixed issues half of the lookups each way.
	LookupMixed
)

// String returns "openpath", "statx" or "mixed".
func (l LookupOp) String() string {
	switch l {
	case LookupStatx:
		return "statx"
	case LookupMixed:
		return "mixed"
	case LookupOpenPath:
		return "openpath"
	}
	return fmt.Sprintf("LookupOp(%d)", uint8(l))
}

// Upper bounds of the size and count options, which Open checks. Each is
// far above any useful value, and low enough that what Open allocates from
// it, or asks of the kernel, stays sane.
const (
	depthBound            = 1 << 16 // request slots, allocated by Open: about 16 MiB
	batchMaxBound         = 1 << 20 // a request's key offsets and counts are int32
	lookupCacheSizeBound  = 1 << 24 // entries per ring: about 1.6 GiB each when full
	ringsBound            = 64      // a request marks its rings in a uint64
	opsMaxBound           = 1 << 16 // op slots and their kernel memory, allocated per ring by Open
	workersMaxBound       = 1 << 12 // kernel worker threads per ring
	syncWorkersBound      = 1 << 12 // goroutines of the sync engine
	breakerThresholdBound = opsMaxBound
	// buffersBound: a ring registers at most 16,384 buffers
	// (IORING_MAX_REG_BUFFERS, io_uring/rsrc.h), and the tier's own header
	// buffer is one of them.
	buffersBound     = 1<<14 - 1
	buffersSizeBound = 1 << 36 // bytes of Buffers, mapped by Open: 64 GiB
)

// Options configure a Tier. Zero values take the documented defaults.
type Options struct {
	// BlockSize is every block's payload size in bytes. Required.
	BlockSize int
	// Namespace is the directory under the tier's root holding its
	// blocks; "default" by default.
	Namespace string
	// Layout maps keys to paths beneath the namespace directory;
	// blockstore.FanoutLayout by default.
	Layout blockstore.Layout
	// Format is how blocks sit in their files: blockstore.FormatFramed
	// (a header naming the key, with checksums) by default, or FormatRaw
	// (the payload alone, valid when it is exactly BlockSize bytes; a
	// store skips a block already there and answers StatusPresent).
	Format blockstore.Format
	// OnCorrupt is what a load does with a block file it finds corrupt:
	// by default (CorruptDefault) it moves a framed one into
	// <root>/~quarantine and leaves a raw one alone, since in a directory
	// shared with other writers the file is theirs; CorruptRemove deletes
	// it, as vLLM does after a failed load.
	OnCorrupt blockstore.CorruptAction
	// VLLM, when set, opens one rank's blocks of one KV-cache group in a
	// directory of vLLM's filesystem offloading tier, the root being
	// vLLM's root: Namespace is the rank directory and Layout
	// blockstore.VLLMLayout of the group (leave them unset, or set them
	// to those), Format is FormatRaw. Open does what a vLLM process does
	// when it starts: it makes the rank directory if it is missing, writes
	// the base directory's config.json unless it is there (only when
	// VLLM.Config is known), and probes O_DIRECT with a temporary file named
	// as vLLM names its own (*_<digits>.tmp), removed at once. Reading
	// never changes the directory: corrupt blocks stay unless OnCorrupt
	// says otherwise.
	VLLM *blockstore.VLLM
	// Engine picks the engine; EngineAuto by default.
	Engine EngineKind
	// Depth is how many requests may be submitted and not yet polled;
	// beyond it submits return ErrBusy. Default 256, at most 65,536.
	Depth int
	// BatchMax is the most keys in one request. Default 4096, at most
	// 1,048,576.
	BatchMax int
	// LookupTimeout is a lookup key's deadline, from submit. Default 5s.
	LookupTimeout time.Duration
	// IOTimeout is a load or store key's deadline, from submit. Default 30s.
	IOTimeout time.Duration
	// LookupCacheTTL: a lookup of a key looked up, loaded or stored this
	// recently is answered from memory, at over 10 M keys/s
	// (BenchmarkLookupCached), and a store of a key known to be there is
	// answered StatusPresent without writing; loads always go to the
	// filesystem. Default 1 s; negative turns the cache off. A scheduler
	// that asks about a waiting request's blocks every step then costs the
	// filesystem one lookup per key a second; and a lookup of fewer than
	// 128 keys that the cache answers whole is answered in the Lookup
	// call itself, its Result ready for the next Poll, without waking an
	// owner (a round trip of 8 keys in 0.4 us,
	// BenchmarkLookupCachedRoundTrip); a larger one goes to one owner,
	// which wakes the others only if the caches lack a key. Staleness is bounded by the TTL
	// and is safe: a block found in memory but gone from disk (evicted by
	// another process) loads as StatusMissing, and the cache learns it;
	// a block another process stored since is reported missing for at
	// most the TTL. Tier.InvalidateLookups empties the cache; deletes,
	// the evictor's among them, update it.
	LookupCacheTTL time.Duration
	// LookupCacheSize bounds the cache's entries, per ring. Default 1<<20,
	// at most 1<<24.
	LookupCacheSize int
	// Durability of stores; blockstore.DurabilityNone by default (safe for
	// a cache: a block torn by a power loss fails its checksum).
	Durability blockstore.Durability
	// Rings is the number of io_uring instances, each with its own owner
	// goroutine; keys are spread over them (by hash; loads to the least
	// busy), so that one request's keys use every CPU; at most 64.
	// Default: GOMAXPROCS, at most 8.
	// Owners of local filesystems are ordinary goroutines, so that waking
	// one is cheap whatever the count: measured on 2 CPUs, ext4, medians
	// of 5 runs (BenchmarkLookupRoundTrip: one request of 8 warm keys,
	// submit to result polled), 26 µs with a ring per CPU [23–28], 26 µs
	// with one [19–28], and 43 µs for the sync engine [43–44]; owners
	// locked to their threads took 136 µs (one ring) and 174 µs (two).
	// A ring's inline work (warm lookups, page-cache copies) runs on its
	// owner's CPU, one at a time under the ring's lock: fewer rings than
	// CPUs bound it to that many CPUs. With fewer rings than GOMAXPROCS a
	// caller finds a P whatever the owners hold, so an owner never yields
	// its P, one that keeps a thread sleeps in io_uring_enter, and the
	// checksums of loads of 8 MiB or more through the page cache run on
	// goroutines of their own (8 MiB loads on one ring of 2 CPUs:
	// 1.12-1.45x the bytes a second of the owner checksumming them
	// itself). Against the engine's first design (owners asleep in the
	// kernel, holding a P; one ring on 2 CPUs and STATX lookups by
	// default), BenchmarkLookup,
	// 1,024-key batches, medians of 5 interleaved rounds of per-round
	// ratios: with a ring per CPU, O_PATH lookups (with O_DIRECTORY) made
	// 1.73 (1.07-2.35) of the first design's default, and STATX 0.82
	// (0.71-1.22) of its own STATX on two rings; with one ring, O_PATH
	// made 1.16 (0.90-1.67) of the first design's O_PATH on one ring but
	// 0.86 (0.62-1.17) of its default, whose STATX ran in kernel workers
	// on both CPUs where one ring's inline opens run on one; STATX on one
	// ring made 0.97 (0.84-1.15) of the same, with round trips of 8 keys
	// of 84-106 µs against 69-112 µs (an earlier week).
	Rings int
	// OpsMax is how many key operations one ring (or the sync engine) has
	// in flight at most. Default 1024, at most 65,536. Of them, stores are
	// at most 16, deletes 32, and a ring's lookups 256 (or WorkersMax, if
	// more).
	OpsMax int
	// WorkersMax limits the kernel worker threads of each ring (bounded
	// and unbounded alike) on FUSE, NFS and unknown filesystems, where each
	// owner keeps a thread of its own, so a hung filesystem holds at most
	// that many. On local filesystems, where owners are ordinary
	// goroutines, it limits the workers of each Go thread that submits
	// (they serve page-cache misses and cold lookups). Default 64, at most
	// 4,096.
	WorkersMax int
	// SyncWorkers is the sync engine's goroutine count, and the io_uring
	// engine's store pool's (EngineInfo.StoresSync), split between its
	// rings. Default 16, at most 4,096.
	SyncWorkers int
	// BreakerThreshold is how many stuck operations (past their deadline
	// and not answered) open the circuit breaker. Default 64, at most
	// 65,536; above OpsMax it never opens, since a ring holds at most
	// OpsMax operations.
	BreakerThreshold int
	// Lookup picks the io_uring lookup operation; LookupOpenPath by
	// default.
	Lookup LookupOp
	// StoresOnRing keeps the io_uring engine's stores on its rings on a
	// local filesystem (EngineInfo.Inline) too. By default they run there,
	// O_DIRECT ones too, as plain system calls on a pool of goroutines per
	// ring (SyncWorkers in all, EngineInfo.StoresSync; but an O_DIRECT
	// store's write while many are in flight, which goes back to the
	// ring): a store's O_CREAT
	// open, its rename and any mkdir always go from the ring to a kernel
	// worker, a hand-off and a few context switches each, which cost more
	// CPU than the calls themselves, and the workers, which Go's Ps do not
	// bound, take the CPU of the caller and of lookups and loads. On the
	// rings, 64 KiB O_DIRECT stores made 1.04-1.18x the pool's keys a
	// second, with Store calls 4-7x the sync engine's at p99.9 (the
	// pool's: 0.87-0.96x) and the p99 of lookups and loads beside them
	// 1.15-1.43x their own without the stores (the pool's: 0.81-0.95x;
	// docs/performance.md). Stores on FUSE, NFS and unknown
	// filesystems stay on the rings, where no thread blocks per file.
	// (On tmpfs loads run on that pool too, whatever this says:
	// EngineInfo.LoadsSync.)
	StoresOnRing bool
	// NoDirect turns O_DIRECT off for loads and stores even where it
	// works. With it on (the default, where the filesystem takes O_DIRECT
	// and BlockSize is a multiple of 4 KiB), both engines load and store
	// buffers aligned to 4 KiB (Tier.Buffers, uring.AllocBuffer) without
	// the page cache; other buffers go through it.
	NoDirect bool
	// Buffers is how many aligned, registered buffers of BlockSize the
	// tier allocates for callers (Tier.Buffers), in memory it maps (from 2
	// MiB on in transparent huge pages, uring.AllocBuffer) or in
	// BufferMemory. Default 0, at most 16,383
	// (a ring registers at most 16,384 buffers, one of them the tier's
	// own) and 64 GiB in all. Each takes 8 KiB more around it, and with
	// that more than the kernel's 1 GiB a registered buffer, they are not
	// registered.
	Buffers int
	// BufferMemory, when not nil, is the memory the Buffers are laid out
	// in, instead of memory Open maps: BuffersSize(BlockSize, Buffers)
	// bytes or more, from a 4 KiB boundary. It is for callers whose views
	// of the buffers must outlive the tier (the C ABI's ut_open_buffers,
	// Python's Tier(buffers=N)): the tier never frees it. Loads write the
	// memory around each buffer too (a block's header before it, what
	// the file holds past its end after it), so the caller leaves all of
	// it alone but the buffers, and keeps it allocated as it keeps a
	// load's buffers: until Close has returned and the release of every
	// buffer a result reported held (Result.Held) has been polled. The
	// io_uring engine registers it: it must be anonymous or shared memory
	// (not a mapping of a file on disk, which Open refuses).
	BufferMemory []byte
	// Capacity bounds the bytes of block files in the namespace directory,
	// whoever wrote them; 0: no bound. With a bound, the tiers sharing the
	// directory (processes, hosts) elect one evictor through a lock on
	// <namespace>/~lease; when usage passes HighWatermark × Capacity it
	// removes the least recently used blocks, through the engine's queue
	// after all other work, down to LowWatermark × Capacity; and while
	// usage is at Capacity (every block younger than EvictMinAge, or the
	// evictor behind) or the filesystem lacks room for the stores in
	// flight, stores are refused before writing: StatusFull, ErrFull.
	// Every tier sharing the directory should set it: any may become the
	// evictor, and each records its hits (TouchInterval). Until the usage
	// is first known (the lease file's last published count, or the
	// evictor's first scan, which Stats.Scans counts), a tier takes the
	// whole filesystem's use for it: on a filesystem fuller than the
	// capacity, stores are refused for that moment. See evictor.go.
	Capacity int64
	// CapacityShare is the bound as a share (0 to 1) of the filesystem's
	// size instead; at most one of Capacity and CapacityShare.
	CapacityShare float64
	// HighWatermark and LowWatermark are shares of the capacity (0 <
	// low ≤ high ≤ 1): eviction starts above the high mark and stops at
	// the low one. Defaults 0.9 and 0.8.
	HighWatermark, LowWatermark float64
	// EvictMinAge: blocks used (stored, found, loaded) more recently are
	// never evicted. Default 10 s; negative: none.
	EvictMinAge time.Duration
	// EvictInterval is how often the evictor (or a tier waiting for the
	// lease) looks: the takeover time when the evictor dies, and the
	// staleness of usage between its rescans. Default 1 s.
	EvictInterval time.Duration
	// TouchInterval: a tier that finds, loads or re-offers a block sets
	// the file's access time, at most once per block per interval, so
	// that the evictor, in whichever process, sees the use (also on
	// noatime mounts). Default 1 minute with a capacity, else off;
	// negative: off. See recency.go.
	TouchInterval time.Duration
	// Logger receives the tier's state changes: the engine chosen and
	// why, a fallback to the sync engine, the O_DIRECT probe's result, the
	// circuit breaker opening and closing, corrupt blocks quarantined
	// (at most a line a second), operations still stuck at Close. Never a
	// line per key or per request. Nil: silent.
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if v := o.VLLM; v != nil {
		if o.Namespace == "" {
			o.Namespace = v.Namespace()
		}
		if o.Layout == nil {
			o.Layout = v.Layout()
		}
		o.Format = blockstore.FormatRaw
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Layout == nil {
		o.Layout = blockstore.FanoutLayout{}
	}
	def(&o.Depth, 256)
	def(&o.BatchMax, 4096)
	def(&o.LookupCacheSize, 1<<20)
	def(&o.Rings, min(runtime.GOMAXPROCS(0), 8))
	def(&o.OpsMax, 1024)
	def(&o.WorkersMax, 64)
	def(&o.SyncWorkers, 16)
	def(&o.BreakerThreshold, 64)
	if o.LookupCacheTTL == 0 {
		o.LookupCacheTTL = time.Second
	}
	if o.LookupTimeout == 0 {
		o.LookupTimeout = 5 * time.Second
	}
	if o.IOTimeout == 0 {
		o.IOTimeout = 30 * time.Second
	}
	if o.HighWatermark == 0 {
		o.HighWatermark = 0.9
	}
	if o.LowWatermark == 0 {
		o.LowWatermark = min(0.8, o.HighWatermark)
	}
	switch {
	case o.EvictMinAge == 0:
		o.EvictMinAge = 10 * time.Second
	case o.EvictMinAge < 0:
		o.EvictMinAge = 0
	}
	if o.EvictInterval == 0 {
		o.EvictInterval = time.Second
	}
	if o.TouchInterval == 0 && (o.Capacity > 0 || o.CapacityShare > 0) {
		o.TouchInterval = time.Minute
	}
	if o.Engine == EngineAuto {
		if e, err := ParseEngine(os.Getenv(EngineEnv)); err == nil {
			o.Engine = e
		}
	}
}

func (o *Options) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
	}
	if o.BlockSize <= 0 || int64(o.BlockSize) > blockstore.PayloadSizeMax {
		return bad("BlockSize %d (want 1 to %d)", o.BlockSize, blockstore.PayloadSizeMax)
	}
	// Defaults are applied: only Buffers may still be zero.
	for _, l := range []struct {
		name      string
		v, lo, hi int
	}{
		{"Depth", o.Depth, 1, depthBound},
		{"BatchMax", o.BatchMax, 1, batchMaxBound},
		{"LookupCacheSize", o.LookupCacheSize, 1, lookupCacheSizeBound},
		{"Rings", o.Rings, 1, ringsBound},
		{"OpsMax", o.OpsMax, 1, opsMaxBound},
		{"WorkersMax", o.WorkersMax, 1, workersMaxBound},
		{"SyncWorkers", o.SyncWorkers, 1, syncWorkersBound},
		{"BreakerThreshold", o.BreakerThreshold, 1, breakerThresholdBound},
		{"Buffers", o.Buffers, 0, buffersBound},
	} {
		if l.v < l.lo || l.v > l.hi {
			return bad("%s %d (want %d to %d)", l.name, l.v, l.lo, l.hi)
		}
	}
	// Both factors are bounded above, so the product cannot overflow.
	n := int64(o.Buffers) * int64(bufferStride(o.BlockSize))
	if n > buffersSizeBound {
		return bad("Buffers %d of BlockSize %d map %d bytes (want at most %d)", o.Buffers, o.BlockSize, n, buffersSizeBound)
	}
	switch m := o.BufferMemory; {
	case m == nil:
	case o.Buffers == 0:
		return bad("BufferMemory without Buffers")
	case int64(len(m)) < n:
		return bad("BufferMemory of %d bytes for Buffers %d of BlockSize %d (want BuffersSize: %d)", len(m), o.Buffers, o.BlockSize, n)
	case !aligned(m[:0]):
		return bad("BufferMemory at %p (want a 4 KiB boundary)", unsafe.SliceData(m))
	}
	switch {
	case o.LookupTimeout < 0 || o.IOTimeout < 0 || o.EvictInterval < 0:
		return bad("negative duration")
	case o.Capacity < 0 || !(o.CapacityShare >= 0 && o.CapacityShare <= 1) || o.Capacity > 0 && o.CapacityShare > 0:
		return bad("Capacity %d, CapacityShare %v (want one of a byte count, a share from 0 to 1)", o.Capacity, o.CapacityShare)
	case !(o.LowWatermark > 0 && o.LowWatermark <= o.HighWatermark && o.HighWatermark <= 1):
		return bad("watermarks low %v, high %v (want 0 < low ≤ high ≤ 1)", o.LowWatermark, o.HighWatermark)
	case o.Engine > EngineSync:
		return bad("engine %v", o.Engine)
	case o.Lookup > LookupMixed:
		return bad("lookup op %d", o.Lookup)
	case o.Durability > blockstore.DurabilityFull:
		return bad("Durability %d (want none, data or full)", o.Durability)
	case o.Format > blockstore.FormatRaw:
		return bad("Format %d (want framed or raw)", o.Format)
	case o.OnCorrupt > blockstore.CorruptQuarantine:
		return bad("OnCorrupt %d (want default, leave, remove or quarantine)", o.OnCorrupt)
	}
	if v := o.VLLM; v != nil {
		if l, ok := o.Layout.(blockstore.VLLMLayout); !ok || l != v.Layout() || o.Namespace != v.Namespace() {
			return bad("Namespace %q and Layout %v are not those of VLLM (%q, %v): leave them unset", o.Namespace, o.Layout, v.Namespace(), v.Layout())
		}
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
	}
	if err := blockstore.ValidateNamespace(o.Namespace); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if os.Getenv(EngineEnv) != "" {
		if _, err := ParseEngine(os.Getenv(EngineEnv)); err != nil {
			return fmt.Errorf("%s: %w", EngineEnv, err)
		}
	}
	return nil
}
