package tier

import (
	"fmt"
	"os"
	"runtime"
	"time"

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
// present, 1,024-key batches, one ring, three runs each (BenchmarkLookup,
// BenchmarkLookupCold): warm, STATX 0.50–0.55 M keys/s, mixed 0.45–0.61 M,
// O_PATH 0.39–0.45 M; after dropping caches STATX 0.116–0.121 M, mixed
// 0.100–0.105 M, O_PATH 0.087–0.092 M.
const (
	// LookupStatx, the default, issues STATX, which always runs in a
	// kernel worker: the workers answer on every CPU, and on a cold cache
	// they wait for the disk or the server in parallel.
	LookupStatx LookupOp = iota
	// LookupMixed issues half of the lookups each way: the owner thread
	// answers the O_PATH opens inline while kernel workers answer the
	// STATX calls on other CPUs.
	LookupMixed
	// LookupOpenPath opens the file with O_PATH into a fixed-file slot and
	// closes it in the same chain: the kernel answers it inline when the
	// dentry is cached, without a worker thread, but on the owner's CPU
	// only.
	LookupOpenPath
)

// String returns "statx", "mixed" or "openpath".
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

// Options configure a Tier. Zero values take the documented defaults.
type Options struct {
	// BlockSize is every block's payload size in bytes. Required.
	BlockSize int
	// Namespace is the directory under the tier's root holding its
	// blocks; "default" by default.
	Namespace string
	// Engine picks the engine; EngineAuto by default.
	Engine EngineKind
	// Depth is how many requests may be submitted and not yet polled;
	// beyond it submits return ErrBusy. Default 256.
	Depth int
	// BatchMax is the most keys in one request. Default 4096.
	BatchMax int
	// LookupTimeout is a lookup key's deadline, from submit. Default 5s.
	LookupTimeout time.Duration
	// IOTimeout is a load or store key's deadline, from submit. Default 30s.
	IOTimeout time.Duration
	// LookupCacheTTL: a lookup answered this recently is answered from
	// memory. Zero disables the cache. Default 0.
	LookupCacheTTL time.Duration
	// LookupCacheSize bounds the cache's entries. Default 1<<20.
	LookupCacheSize int
	// Durability of stores; blockstore.DurabilityNone by default (safe for
	// a cache: a block torn by a power loss fails its checksum).
	Durability blockstore.Durability
	// Rings is the number of io_uring instances, each with its own owner
	// thread; keys are spread over them by hash. Default: GOMAXPROCS/2,
	// at least 1 and at most 4. An owner waiting for completions holds a
	// Go P in its system call; with as many rings as Ps, a caller woken by
	// an owner waits for the runtime's sysmon to retake a P (measured on 2
	// CPUs: a round trip of 8 lookups took 105 µs to 10 ms with 2 rings,
	// 35–48 µs with one; BenchmarkLookupRoundTrip).
	Rings int
	// OpsMax is how many key operations one ring (or the sync engine) has
	// in flight at most. Default 1024.
	OpsMax int
	// WorkersMax limits the kernel worker threads of each ring (bounded
	// and unbounded alike), so a hung filesystem holds at most that many.
	// Default 64.
	WorkersMax int
	// SyncWorkers is the sync engine's goroutine count. Default 16.
	SyncWorkers int
	// BreakerThreshold is how many stuck operations (past their deadline
	// and not answered) open the circuit breaker. Default 64.
	BreakerThreshold int
	// Lookup picks the io_uring lookup operation; LookupStatx by default.
	Lookup LookupOp
	// NoDirect turns O_DIRECT off for loads even where it works.
	NoDirect bool
	// Buffers is how many aligned, registered buffers of BlockSize the
	// tier allocates for callers (Tier.Buffers). Default 0.
	Buffers int
}

func (o *Options) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	def(&o.Depth, 256)
	def(&o.BatchMax, 4096)
	def(&o.LookupCacheSize, 1<<20)
	def(&o.Rings, min(max(runtime.GOMAXPROCS(0)/2, 1), 4))
	def(&o.OpsMax, 1024)
	def(&o.WorkersMax, 64)
	def(&o.SyncWorkers, 16)
	def(&o.BreakerThreshold, 64)
	if o.LookupTimeout == 0 {
		o.LookupTimeout = 5 * time.Second
	}
	if o.IOTimeout == 0 {
		o.IOTimeout = 30 * time.Second
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
	switch {
	case o.BlockSize <= 0 || int64(o.BlockSize) > blockstore.PayloadSizeMax:
		return bad("BlockSize %d (want 1 to %d)", o.BlockSize, blockstore.PayloadSizeMax)
	case o.Depth < 0, o.BatchMax < 0, o.Rings < 0, o.OpsMax < 0, o.WorkersMax < 0, o.SyncWorkers < 0,
		o.BreakerThreshold < 0, o.LookupCacheSize < 0, o.Buffers < 0:
		return bad("negative limit")
	case o.OpsMax > 1<<16:
		return bad("OpsMax %d (at most 65536)", o.OpsMax)
	case o.Rings > 64:
		return bad("Rings %d (at most 64)", o.Rings)
	case o.LookupTimeout < 0 || o.IOTimeout < 0 || o.LookupCacheTTL < 0:
		return bad("negative duration")
	case o.Engine > EngineSync:
		return bad("engine %v", o.Engine)
	case o.Lookup > LookupOpenPath:
		return bad("lookup op %d", o.Lookup)
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
