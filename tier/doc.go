// Package tier is an asynchronous store of fixed-size blocks in a
// directory: a caller submits batches of lookups, loads and stores and
// later polls for their results, and no call ever waits for the
// filesystem.
//
// # Requests and results
//
// Lookup, LookupPrefix, Load, Store and Delete each submit one request: an integer
// ID chosen by the caller and a batch of keys. They return at once: nil
// (queued), ErrBusy (Options.Depth requests are submitted and not yet
// polled), ErrClosed, or an ErrInvalid error for a bad key or buffer. Every
// queued request produces exactly one Result, with an outcome per key and
// the length of the successful prefix, which Poll copies into memory the
// caller owns; Ready signals that results are waiting. Keys are copied at
// submit; buffers are not: a load's or store's buffers belong to the tier
// until its Result has been polled (and, in the rare case Result.Held > 0,
// until its OpRelease Result).
//
// # Threading
//
// Keys of lookups, stores and deletes are spread by hash over shards (a ring
// per CPU), so that one shard holds what the tier knows of a key; a load's
// keys go in runs of 16 (loadRun) to the shards with the fewest load keys
// unanswered (what a load learns goes to the key's shard).
// Each shard has one owner goroutine that alone issues its IO: with the
// io_uring engine on a local filesystem it is an ordinary goroutine; on
// FUSE, NFS and unknown filesystems, and with STATX lookups, it is locked to
// the OS thread that created its ring (IORING_SETUP_SINGLE_ISSUER, and
// DEFER_TASKRUN with STATX lookups on a local filesystem;
// EngineInfo.OwnThreads). It sleeps on a channel when the
// kernel holds none of its operations and otherwise on the ring's eventfd in
// Go's netpoller, holding no P either way (with fewer rings than Ps, where a
// caller finds a P anyway, a locked owner sleeps in io_uring_enter and no
// owner yields its P). An owner that has just answered loads first lingers
// up to 20 µs, handing its P to any goroutine that waits for one, while its
// lingers keep ending in a caller's wake (uringBackend.linger). On FUSE, NFS
// and unknown filesystems, with many
// operations there that take long, it first lets their completions gather
// for a while (gatherWindow); callers hand it work through a
// mutex-guarded inbox and wake it (a load, store or delete only when no
// completion is due to, shard.enqueue), never touching the ring. The sync
// engine's owner hands key operations to a fixed pool of goroutines doing
// plain system calls; so does an io_uring owner with stores on a local
// filesystem (EngineInfo.StoresSync: io_uring hands every store's O_CREAT
// open and rename to kernel workers, which take the caller's CPU), and
// with loads on tmpfs (EngineInfo.LoadsSync). What an operation does on disk is blockstore's
// Program, which both engines execute (io_uring: one SQE per step); above
// the IO they share request bookkeeping, lookup sharing (one kernel
// operation per key in flight, whatever the number of requests asking,
// and none shared across a store or delete of the key: a lookup submitted
// after its Result starts its own), the
// lookup cache, deadlines and the circuit breaker. So their semantics are
// the same by construction. A lookup of fewer than 128 keys that the
// shards' caches answer whole is answered by the caller's own call, which
// reads those caches under the mutex their owners write them under, and
// wakes no owner (Options.LookupCacheTTL); a larger one goes to one owner,
// which answers it from the shards' caches if they hold every key, and
// otherwise hands it on to the other owners. In a prefix lookup, keys after
// one the cache says missing need not be cached. An engine that fails (a ring the kernel stops
// accepting) fails the tier with ErrBroken, never the process.
//
// # Deadlines and hung filesystems
//
// A key not answered by its deadline (Options.LookupTimeout, IOTimeout) is
// reported StatusTimedOut; the engine asks the kernel to cancel it
// (IORING_OP_ASYNC_CANCEL) and keeps every buffer and path the kernel may
// still use until the late completion arrives. A filesystem that holds
// Options.BreakerThreshold operations past their deadlines opens the
// breaker: new keys fail fast with ErrBreakerOpen, except one probe at a
// time, until a probe is answered in time. On network and FUSE filesystems
// kernel worker threads per ring are capped (Options.WorkersMax), so a hung
// NFS server cannot make the kernel spawn a thread per request.
//
// # Directories shared with others
//
// Directories removed while the tier runs are created again: a store that
// cannot create beneath the namespace directory's fd recreates the
// directory (with the root, and the quarantine directory if loads use it)
// and opens it
// again, and each backend checks about once a second that its fd is still
// the directory at the namespace's path, so lookups and loads see what
// stores write. Both engines open block files beneath that fd without
// following symlinks and without waiting (openat2 RESOLVE_BENEATH|
// RESOLVE_NO_SYMLINKS, O_NONBLOCK): anything but a regular file at a block
// path is StatusCorrupt, and a corrupt file is quarantined, removed or left
// as Options.OnCorrupt says (a symlink is always left in place). Deletes
// and those disposals act beneath the block's directory, opened the same
// way: a link in place of a fan-out directory makes a delete's block
// StatusMissing, and nothing outside the namespace directory is removed.
//
// # Formats and layouts
//
// Options.Format and Layout are blockstore's seams, and part of the
// programs both engines run: the framed format (a header naming the key,
// with checksums; corrupt files quarantined by default) or the raw one
// (the payload alone, valid at exactly BlockSize bytes; corrupt files left
// alone by default; a store of a block already there answers
// StatusPresent). Options.VLLM opens a directory of vLLM's filesystem
// offloading tier as vLLM lays it out (blockstore.VLLM): raw blocks, stores
// that publish by rename as vLLM's do (so both may write it at once and
// neither sees a torn block), and reads that change nothing in it.
//
// # Capacity
//
// With Options.Capacity (or CapacityShare) the tiers sharing a namespace
// directory elect one evictor through a lock on a lease file in it
// (blockstore.TryLease). It counts the namespace once (blockstore.Index),
// then re-reads only changed directories, and removes the least recently
// used blocks through the engine's queue (OpDelete, after all other work)
// from above the high mark down to the low one; recency comes from the
// blocks' times, which every tier touches when it uses a block
// (TouchInterval). Stores are refused before writing (StatusFull) while
// the estimated usage is at the capacity. See evictor.go and recency.go.
//
// # Memory
//
// Each shard preallocates its operation slots (Options.OpsMax), their
// paths, statx buffers and 8 KiB of header memory (a header, and room for
// a load's read past the block's end); in steady state submit and
// Poll allocate nothing per key. Options.Buffers asks for aligned buffers
// registered with every ring (Tier.Buffers): the fastest path for loads,
// with O_DIRECT where the filesystem allows it.
package tier
