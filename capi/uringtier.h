/*
 * uringtier.h: the C ABI of liburingtier, an asynchronous store of
 * fixed-size blocks (e.g. LLM KV-cache blocks) kept as files, looked up,
 * read and written through io_uring (or plain system calls where io_uring
 * is unusable).
 *
 * Build: go build -buildmode=c-shared -o liburingtier.so ./capi
 * (or `make capi`, which also copies this header next to the library).
 *
 * # Model
 *
 * A caller submits a request (an ID of its choosing and a batch of keys)
 * with ut_lookup, ut_lookup_prefix, ut_load, ut_store or ut_delete; the call returns
 * at once, queued or refused. Every queued request produces exactly one
 * result, which ut_poll copies into arrays the caller owns. When results
 * are waiting, the descriptor ut_fd returns becomes readable, so a foreign
 * event loop (epoll, select, Python's selectors or asyncio) can wait on it.
 *
 * # Calls never wait for the filesystem
 *
 * Submits, ut_poll, ut_fd, ut_cancel, ut_read_gauges, ut_stats and ut_engine return
 * without waiting for any IO: the IO runs on threads of the library's own
 * (io_uring owner threads or a bounded pool), which never call back into
 * the caller. ut_close and ut_exists wait, each at most the timeout it is
 * given, and ut_free briefly. ut_open does IO itself (it creates the
 * namespace directory and probes the filesystem), so it can wait on a hung
 * filesystem: open tiers at start-up, not on a latency-critical thread.
 *
 * # Threads
 *
 * Every function may be called from any thread, concurrently, on the same
 * or different tiers, as the Go API allows. Error details are per thread
 * (ut_last_error).
 *
 * # Memory
 *
 * No pointer into the library's memory is ever handed out: a tier is an
 * integer handle, and results, statuses and JSON are copied into arrays
 * the caller provides. Keys are copied by the submitting call.
 *
 * Buffers are not copied. The memory given to ut_load (written by the
 * library) and ut_store (read by the library) stays in use by the library
 * until the request's result has been returned by ut_poll; the caller must
 * keep it allocated until then, and must not write to it (nor read a
 * load's buffers, which are being filled). If
 * that result has held > 0 (a load or store timed out in a hung filesystem
 * and the kernel still holds some of its buffers), the rule extends until
 * a result with op UT_OP_RELEASE and the same req has been polled. ut_close
 * and ut_free do not end it: memory still held when a tier is freed must
 * stay allocated for the life of the process.
 *
 * # fork(2)
 *
 * The library carries a Go runtime, which does not survive fork: the child
 * has one thread and a runtime that believes it has many. In a child forked
 * after the library was loaded, every function below but ut_abi_version,
 * ut_strerror and ut_last_error (which never enter the runtime) fails at
 * once with UT_EFORK, without entering it. Load the library after the fork
 * (Python: multiprocessing's "spawn" start method) in each process that
 * uses it.
 */
#ifndef URINGTIER_H
#define URINGTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* UT_ABI_VERSION changes whenever a declaration below changes meaning.
 * 2: ut_delete, UT_OP_DELETE, UT_DELETED (a success: UT_OK_STATUS), UT_FULL;
 * the capacity options. 3: ut_buffers_size, ut_open_buffers, ut_buffers.
 * 4: ut_read_gauges and struct ut_gauges. */
#define UT_ABI_VERSION 4

/* A tier handle. 0 is never a valid handle; a freed handle is never reused. */
typedef uint64_t ut_tier;

/* Error codes: every int-returning call returns a value >= 0 on success and
 * one of these (all negative) on failure; ut_strerror describes each. */
enum ut_error {
	UT_OK = 0,
	UT_EBUSY = -1,    /* depth full: nothing was queued; poll and retry later */
	UT_ECLOSED = -2,  /* the tier is closed */
	UT_EINVAL = -3,   /* a bad request: key size, buffer size, too many keys, request ID in flight */
	UT_EOPTIONS = -4, /* ut_open: bad options */
	UT_EHANDLE = -5,  /* not a tier handle, or one already freed */
	UT_ESTUCK = -6,   /* ut_close: operations still held by a hung filesystem at the timeout */
	UT_EFORK = -7,    /* called in a child forked after the library was loaded */
	UT_EIO = -8,      /* ut_open: the directory or the engine could not be set up */
	UT_ERANGE = -9,   /* ut_poll: a waiting result has more keys than status_cap */
	UT_EARG = -10,    /* a NULL pointer or impossible length where one is required */
	UT_EBROKEN = -11, /* a submit: the engine failed (an io_uring instance the kernel stopped accepting); every
	                   * later submit fails so too and keys in flight end UT_FAILED: close and reopen the tier */
};

/* What a request did (ut_result.op). */
enum ut_op {
	UT_OP_LOOKUP = 1,  /* which keys exist */
	UT_OP_LOAD = 2,    /* read blocks into the caller's buffers */
	UT_OP_STORE = 3,   /* write blocks from the caller's buffers */
	UT_OP_RELEASE = 4, /* the kernel has let go of a request's held buffers */
	UT_OP_DELETE = 5,  /* remove blocks */
};

/* The outcome of one key (a byte in the status array given to ut_poll). */
enum ut_status {
	UT_PENDING = 0,   /* no outcome yet (never seen in a result) */
	UT_FOUND = 1,     /* lookup: the block exists */
	UT_LOADED = 2,    /* load: the payload is in the caller's buffer, verified (checksums; raw: its size) */
	UT_STORED = 3,    /* store: the block was published */
	UT_PRESENT = 4,   /* store: the block was already there; nothing written */
	UT_MISSING = 5,   /* lookup, load or delete: no such block (ut_exists: no such path) */
	UT_CORRUPT = 6,   /* load: the file failed verification (quarantined, removed or left: on_corrupt) */
	UT_TIMEDOUT = 7,  /* the deadline passed, or the circuit breaker is open */
	UT_FAILED = 8,    /* an IO error */
	UT_CANCELED = 9,  /* ut_cancel or ut_close ended it first */
	UT_SKIPPED = 10,  /* ut_lookup_prefix: after a miss, not looked up */
	UT_DELETED = 11,  /* delete: the block was removed */
	UT_FULL = 12,     /* store: no room (capacity reached, or the filesystem full); nothing left behind */
};

/* UT_OK_STATUS(s): is s a success (found, loaded, stored, present, deleted)? */
#define UT_OK_STATUS(s) (((s) >= UT_FOUND && (s) <= UT_PRESENT) || (s) == UT_DELETED)

/* One finished request, as ut_poll returns it. 32 bytes. */
typedef struct ut_result {
	uint64_t req;    /* the caller's request ID */
	uint32_t op;     /* enum ut_op */
	uint32_t keys;   /* keys in the request; 0 for UT_OP_RELEASE */
	uint32_t first;  /* the keys' statuses are status[first .. first+keys) of ut_poll's array */
	uint32_t prefix; /* how many leading keys succeeded: the prefix hit */
	uint32_t held;   /* buffers the kernel still holds; a UT_OP_RELEASE result follows */
	uint32_t reserved;
} ut_result;

/* ut_abi_version returns UT_ABI_VERSION as the library was built. */
int ut_abi_version(void);

/* ut_strerror returns a static description of an error code (never NULL). */
const char *ut_strerror(int code);

/* ut_last_error returns the message of the last failed call on this thread,
 * with details ("buffer 3 is 100 bytes, BlockSize is 4096"), or "" if none.
 * It stays valid until the next failing call on the same thread. */
const char *ut_last_error(void);

/*
 * ut_open opens a tier on the directory dir (created if needed) and stores
 * its handle in *out. options is a string of key=value pairs separated by
 * spaces or commas (NULL or "" for the defaults); block_size is required:
 *
 *   block_size=N          every block's payload size in bytes (required)
 *   namespace=NAME        directory under dir holding the blocks [default]
 *   engine=auto|uring|sync  [auto: io_uring where usable here; URINGTIER_ENGINE overrides auto]
 *   depth=N               requests submitted and not yet polled; more give UT_EBUSY [256]
 *   batch_max=N           most keys in one request [4096]
 *   lookup_timeout=D      a lookup key's deadline from submit [5s]
 *   io_timeout=D          a load or store key's deadline from submit [30s]
 *   cache_ttl=D           answer lookups this recent from memory; 0 = off [1s]
 *   cache_size=N          lookup cache entries [1048576]
 *   durability=none|data|full  fsync of stores [none]
 *   rings=N               io_uring instances [GOMAXPROCS - 1, at least 1, at most 8:
 *                         a CPU left to the caller's own threads]
 *   ops_max=N             key operations in flight per ring [1024]
 *   workers_max=N         kernel worker threads per ring [64]
 *   sync_workers=N        the sync engine's threads [16]
 *   breaker_threshold=N   stuck operations that open the circuit breaker [64]
 *   lookup_op=openpath|statx|mixed  the io_uring lookup operation [openpath]
 *   direct=true|false     O_DIRECT loads where the filesystem allows [true]
 *   format=framed|raw     block files: a header naming the key with checksums, or the
 *                         payload alone, valid when exactly block_size bytes; a raw store
 *                         skips a block already there (UT_PRESENT) [framed]
 *   on_corrupt=default|leave|remove|quarantine  what a load does with a corrupt block file
 *                         [default: quarantine a framed one, leave a raw one]
 *   layout=fanout|vllm    <dir>/<namespace>/<aa>/<bb>/<hex>.blk, or a directory of vLLM's
 *                         filesystem offloading tier (below) [fanout]
 *
 * Capacity: with a bound, the tiers sharing the namespace directory (in any
 * process or host) elect one evictor, which removes the least recently used
 * blocks once usage passes high_watermark of the bound, down to
 * low_watermark; while usage is at the bound (every block younger than
 * evict_min_age, or the evictor behind) or the filesystem is full, stores
 * are refused before writing: UT_FULL. Give every tier sharing the
 * directory the same bound: any may become the evictor.
 *
 *   capacity=N            bytes of block files in the namespace directory, whoever wrote
 *                         them; 0 = no bound [0]
 *   capacity_share=F      the bound as a share (0 to 1) of the filesystem's size instead;
 *                         at most one of capacity and capacity_share [0]
 *   high_watermark=F      eviction starts above this share of the bound [0.9]
 *   low_watermark=F       and stops at this one (0 < low <= high <= 1) [0.8, at most high]
 *   evict_min_age=D       blocks used (stored, found, loaded) more recently are never
 *                         evicted; 0 = no minimum [10s]
 *   evict_interval=D      how often the evictor, or a tier waiting to become it, looks:
 *                         the takeover time when the evictor dies [1s]
 *   touch_interval=D      a hit sets the block file's access time at most this often per
 *                         block, so the evictor sees the use; 0 = off [1m with a bound, else off]
 *
 * With layout=vllm, dir is vLLM's root, blocks are raw, and the tier holds one
 * worker's blocks of one KV-cache group: <dir>/<base>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin,
 * where base is <model, '/' replaced by '_'>_<12 hex digits of the run config's SHA-256>.
 * Keys are vLLM's block hashes. Name the base directory by one of:
 *
 *   model=NAME            the model as vLLM has it (org/name): its one base directory in dir
 *   vllm_base=NAME        the base directory's name, when dir holds several for the model
 *   vllm_config=PATH      a run config as vLLM writes config.json: it names the base
 *                         directory, and ut_open writes <base>/config.json if it is absent
 *   rank=N                the worker's rank [0]
 *   group=N               the KV-cache group [0]
 *   parallel_agnostic=true|false  vLLM's rule for one directory shared by every
 *                         parallel layout: with vllm_config, the parallel sizes count as
 *                         1; the rank is 0 [false]
 *
 * namespace is then the rank directory, and not an option. Reading such a
 * directory never changes it (on_corrupt=remove deletes corrupt blocks, as
 * vLLM does after a failed load); stores write <path>_<digits>.tmp and rename
 * it, as vLLM does, so vLLM and the tier can write the directory at once.
 *
 * D is a duration with a unit: "250ms", "5s", "1.5s", "100us"; F a decimal
 * number ("0.5"); N a decimal integer.
 * Returns UT_OK, UT_EOPTIONS or UT_EIO (ut_last_error says why).
 */
int ut_open(const char *dir, const char *options, ut_tier *out);

/*
 * The tier's buffers, in the caller's memory: ut_open_buffers opens a tier
 * as ut_open does, with n buffers of the block size laid out in mem, which
 * holds mem_size bytes, at least ut_buffers_size(block_size, n), from a
 * 4 KiB boundary: anonymous or shared memory (mmap MAP_ANONYMOUS,
 * aligned_alloc(4096, ...), a file in /dev/shm), not a mapping of a file on
 * disk, which the io_uring engine cannot register. From 2 MiB on, memory on
 * a 2 MiB boundary advised madvise(MADV_HUGEPAGE) (as the Python package's
 * is) pins and copies faster: a 2 MiB O_DIRECT store pins one page, not
 * 512 (README, huge pages). ut_buffers gives
 * their addresses. Loads and stores take them as any buffers, and they are
 * the fastest: page-aligned, registered with the io_uring engine, which
 * reads a block into one with one read (O_DIRECT, no page pinned per read),
 * its header landing in the 4 KiB before the buffer. So the library writes
 * mem outside the buffers too: leave that memory alone, and keep all of mem
 * allocated under the rule for a load's buffers (see Memory): until the
 * results of its loads and stores have been polled, ut_close has returned,
 * and any UT_OP_RELEASE has been polled. The library never frees mem.
 */

/* ut_buffers_size returns the bytes of memory n buffers of block_size take,
 * or 0 if either is out of range. */
size_t ut_buffers_size(size_t block_size, size_t n);

/* ut_open_buffers is ut_open with n (> 0) buffers in mem (above). Returns
 * UT_OK, UT_EOPTIONS (mem_size too small, mem not on a 4 KiB boundary or
 * not registrable, too many buffers), UT_EARG or UT_EIO. */
int ut_open_buffers(const char *dir, const char *options, void *mem, size_t mem_size, size_t n, ut_tier *out);

/* ut_buffers writes the addresses of the tier's buffers, in order, into
 * bufs (up to cap of them) and returns how many there are: 0 for a tier of
 * ut_open, UT_ECLOSED once ut_close has been called. */
int ut_buffers(ut_tier t, void **bufs, size_t cap);

/*
 * Submits. Each returns at once: UT_OK (queued: exactly one result will
 * follow), UT_EBUSY, UT_ECLOSED, UT_EINVAL, UT_EHANDLE, UT_EARG or
 * UT_EBROKEN.
 *
 * Keys are n byte strings of 8 to 64 bytes each, concatenated in keys
 * (keys_size bytes in all). key_sizes gives each key's size; if it is NULL,
 * every key has keys_size / n bytes. req is any ID not in flight on this
 * tier (in flight: submitted, and its result, or its UT_OP_RELEASE result,
 * not yet polled).
 */
int ut_lookup(ut_tier t, uint64_t req, const void *keys, size_t keys_size,
              const uint32_t *key_sizes, size_t n);

/* ut_lookup_prefix is ut_lookup for a caller that wants only the prefix:
 * keys after a definite miss may be skipped (UT_SKIPPED). */
int ut_lookup_prefix(ut_tier t, uint64_t req, const void *keys, size_t keys_size,
                     const uint32_t *key_sizes, size_t n);

/* ut_delete removes the keys' blocks: each key ends UT_DELETED, or
 * UT_MISSING if there was no block. Deletes reach the filesystem after the
 * lookups, loads and stores queued before them; a load that opened a block
 * before its delete reads it whole, one after reports it missing. */
int ut_delete(ut_tier t, uint64_t req, const void *keys, size_t keys_size,
              const uint32_t *key_sizes, size_t n);

/* ut_load reads key i's block into bufs[i], which must have buf_size bytes,
 * equal to the tier's block size. The buffers are the library's until the
 * result is polled (see Memory above). Any memory works: a pinned KV pool,
 * a NumPy array, a tensor's storage; page-aligned buffers let the io_uring
 * engine use O_DIRECT. */
int ut_load(ut_tier t, uint64_t req, const void *keys, size_t keys_size,
            const uint32_t *key_sizes, size_t n, void *const *bufs, size_t buf_size);

/* ut_store writes key i's block from bufs[i] (buf_size bytes, the block
 * size), under the same memory rule as ut_load. */
int ut_store(ut_tier t, uint64_t req, const void *keys, size_t keys_size,
             const uint32_t *key_sizes, size_t n, const void *const *bufs, size_t buf_size);

/*
 * ut_poll copies up to results_cap finished requests into results and
 * their keys' statuses (one byte each, enum ut_status) into status, and
 * returns how many results it copied (0: none waiting). It never waits.
 * Result i's statuses are status[results[i].first .. + results[i].keys).
 * A result that does not fit in what is left of status waits for the next
 * call; one larger than status_cap itself gives UT_ERANGE, so give at
 * least the largest request's key count (batch_max always suffices).
 *
 * ut_poll also clears the descriptor of ut_fd: after it becomes readable,
 * call ut_poll until it returns fewer than results_cap.
 */
int ut_poll(ut_tier t, ut_result *results, size_t results_cap, uint8_t *status, size_t status_cap);

/* ut_fd returns an eventfd (non-blocking, close-on-exec) that becomes
 * readable when results are waiting; readiness is a hint, ut_poll is the
 * truth. Owned by the tier: do not read or close it; it is closed by
 * ut_free. Returns the descriptor or an error. */
int ut_fd(ut_tier t);

/* ut_cancel cancels request req: keys not started end UT_CANCELED, keys in
 * the kernel are canceled where it allows, and the result still arrives.
 * Returns 1 if req was in flight, 0 if not, or an error. */
int ut_cancel(ut_tier t, uint64_t req);

/*
 * ut_close stops the tier, waiting at most timeout_ms milliseconds (0: do
 * not wait for the filesystem). Requests submitted before it each still get
 * exactly one result (their outcome or UT_CANCELED), which ut_poll returns
 * after ut_close; every later submit gives UT_ECLOSED. Returns UT_OK, or
 * UT_ESTUCK if a hung filesystem still holds operations: the results of
 * their loads and stores count the buffers in held, and a UT_OP_RELEASE
 * result follows for each once the kernel lets go. A second ut_close
 * returns the first one's code, or UT_ESTUCK if its own timeout passes
 * while the first still waits. A timeout too long for the library (over
 * 292 years) waits as long as it takes.
 */
int ut_close(ut_tier t, int64_t timeout_ms);

/* ut_free closes the tier if needed (without waiting for the filesystem),
 * closes its descriptor and frees the handle. Memory still held by the
 * kernel (see Memory) must stay allocated. Returns UT_OK or UT_EHANDLE. */
int ut_free(ut_tier t);

/* A tier's levels of the moment, as ut_read_gauges reads them. */
typedef struct ut_gauges {
	uint64_t in_flight;    /* key operations in the kernel or the library's workers */
	uint64_t queued;       /* requests waiting for free operation slots */
	uint64_t stuck;        /* operations past their deadline, not yet answered */
	uint64_t held;         /* caller buffers the kernel still holds */
	uint32_t breaker_open; /* 1: new keys fail fast but for one probe */
	uint32_t reserved;
} ut_gauges;

/* ut_read_gauges writes the tier's levels into *out and returns UT_OK (or
 * UT_EARG for a NULL out): what ut_stats has of them, without its counters,
 * histograms and JSON, cheap enough for a scheduler to read at every step
 * (about 10 ns in the library, against 85 us for the counters ut_stats
 * formats). */
int ut_read_gauges(ut_tier t, ut_gauges *out);

/* ut_stats writes the tier's counters as a JSON object (NUL-terminated,
 * truncated to cap) into buf and returns its full length without the NUL,
 * as snprintf does: a result >= cap means call again with more room. Its
 * "namespace" is the directory under the root holding the blocks (with
 * layout=vllm, the rank directory ut_open found). "ops" has per request
 * kind ("lookup", "load", "store", "delete") requests, keys, outcomes by
 * status name ("found", "full", ...) and latency quantiles. With a
 * capacity: "capacity_limit" (bytes), "usage" (bytes of blocks as this
 * tier last knew it), "evictor" (whether this tier evicts),
 * "evictor_holder" (who does: "host pid N"; "" until known), "evicted"
 * and "evicted_bytes" (by this tier), "scans", "scan_blocks" (blocks the
 * running or last scan has seen), "dirs_rescanned", "touches" and
 * "touches_dropped" (access times set to record a use, and skipped). */
int ut_stats(ut_tier t, char *buf, size_t cap);

/* ut_engine writes which engine the tier runs, as JSON ({"kind": "uring",
 * "fallback": "", "rings": 1, "flags": ..., "direct": ..., "no_direct": ...,
 * "fs": ..., "inline": ..., "own_threads": ..., "stores_sync": ...,
 * "loads_sync": ..., "last_page_apart": ...}), like ut_stats. */
int ut_engine(ut_tier t, char *buf, size_t cap);

/*
 * ut_exists says which of n paths exist, as n calls of access(path, F_OK)
 * would, but in parallel on the library's threads: the drop-in for a loop
 * of access() calls. paths holds n NUL-terminated paths back to back
 * (paths_size bytes in all). It waits until every path is answered or
 * timeout_ms has passed, writes status[i] (UT_FOUND, UT_MISSING,
 * UT_TIMEDOUT for a path not answered in time, UT_FAILED for another
 * error) and returns how many were found; n and paths_size are at most
 * 2^31-1 (UT_EARG otherwise). Paths are copied, so a thread
 * stuck in a hung filesystem never touches the caller's memory after the
 * return. Needs no tier.
 */
int ut_exists(const char *paths, size_t paths_size, size_t n, int64_t timeout_ms, uint8_t *status);

#ifdef __cplusplus
}
#endif

#endif /* URINGTIER_H */
