// Package blockstore keeps fixed-size blocks (for example LLM KV-cache
// blocks) as one file each, and defines everything about a block on disk
// that does not depend on how its IO is issued: keys and namespaces, the
// directory layout, the file format, the publish protocol, synchronous
// reference operations and maintenance. What a lookup, load or store does
// on disk is written once, as data: a Program lays out each phase's system
// calls (Steps, linked as io_uring links them) and judges their results.
// Put and Get run programs with plain system calls (Program.RunSync); the
// tier package runs the same programs through io_uring, one SQE per step.
//
// # Keys and namespaces
//
// A key is a block's hash: 8 to 64 opaque bytes. Its file name is its
// lowercase hex, so no key can contain a separator, "..", or NUL, and each
// key has exactly one path. A namespace (one per model and parallel
// configuration, say) is 1 to 128 characters of [A-Za-z0-9._-], not "."
// or "..": a single path component, a directory under the root.
//
// # Layout
//
//	<root>/<namespace>/<hex[0:2]>/<hex[2:4]>/<hex>.blk
//
// Layout builds paths relative to the namespace directory, for openat with
// the namespace's dirfd. The default, FanoutLayout, spreads blocks over
// 65,536 leaf directories. Counting where 10 million random keys (keys
// are hashes) would land gives 152.6 entries per leaf on average, 105 at
// least and 203 at most; at 100 million, about 1,500. Either keeps lookups in ext4's and XFS's hashed
// directories and readdir during maintenance cheap, while the two upper
// levels have exactly 256 entries. Directories are created on demand, once
// per Store (Store.EnsureDir remembers them); if one is removed later, the
// next create in it fails with ENOENT and Put recreates every missing level,
// the root included, and retries once.
// Other layouts plug in through Layout: VLLMLayout is vLLM's (see vLLM's
// directories below).
//
// # Format
//
// Format is the seam beside Layout: FormatFramed, the default, described
// here, or FormatRaw, the payload alone (vLLM's), valid exactly when it is
// a regular file of the block size (CheckRaw). The programs, Put, Get and
// Verify follow the store's format; what a load does with a corrupt file
// is a CorruptAction: quarantine (the framed default), leave (the raw
// default: in a directory shared with other writers the file is theirs) or
// remove (as vLLM does).
//
// A framed block file is a 4096-byte header followed by the payload; its size is
// exactly HeaderSize + payload size, and the payload starts at offset 4096
// so an O_DIRECT read of it into an aligned buffer stays aligned. Integers
// are little-endian. Checksums are CRC32C (Castagnoli).
//
//	offset  size  field
//	     0     4  magic "UTBK"
//	     4     2  format version, 1
//	     6     2  key size in bytes, 8..64
//	     8     8  payload size in bytes, at most PayloadSizeMax
//	    16     4  CRC32C of the payload
//	    20     4  reserved, zero
//	    24    64  key, zero-padded
//	    88  4004  zero
//	  4092     4  CRC32C of bytes 0..4091 (the header checksum)
//
// The header carries the key so that a misplaced or renamed file is caught,
// and every byte of the file is covered by one of the two checksums. A
// file that is short, truncated, extended, mis-keyed or fails a check is
// ErrCorrupt, with a message naming the field. So is anything but a
// regular file at a block path (a FIFO, a directory, a symlink): readers
// open with O_NOFOLLOW|O_NONBLOCK, so they neither follow a link out of
// the tree nor wait for a FIFO's writer.
//
// # Publish protocol
//
// Put writes header and payload to a temporary file in the block's final
// directory, named <hex>.blk.tmp.<pid>.<token> (token: a per-process random
// base plus a counter) and created with O_EXCL, so no two writers —
// goroutines, processes, or hosts sharing an NFS export — share one. The
// file is created beneath the namespace directory's fd without following any
// symlink (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), and each directory
// Put makes is opened the same way before anything is made in it, so a link
// planted in place of a fan-out directory of a shared tree cannot make Put
// write elsewhere. Put then syncs as the Durability asks, closes it (on NFS,
// close reports deferred write errors) and renames it onto <hex>.blk; each
// step runs only if every one before it succeeded. rename(2) is atomic, so
// readers see no block or a whole block, never a partial one. Concurrent
// writers of one key are safe: blocks are content-addressed, so whichever
// rename lands last leaves the same content. If any step fails (ENOSPC, EIO,
// ...), Put removes its temporary file and nothing becomes visible; a writer
// that dies leaves only its temporary file, which Clean removes once it is
// old enough.
//
// A raw store first looks at the block's path and writes nothing when a
// regular file of the block size is there (StatusPresent, as vLLM skips an
// existing file); otherwise it publishes as above, with no header, its
// temporary file opened O_CREAT|O_EXCL|O_WRONLY|O_TRUNC as vLLM opens its
// own.
//
// # vLLM's directories
//
// vLLM's filesystem offloading tier keeps
//
//	<root>/<model, '/' → '_'>_<12 hex>/config.json
//	<root>/<model, '/' → '_'>_<12 hex>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin
//
// where the 12 hex digits begin the SHA-256 of the run config
// (VLLMRunConfig) as compact JSON with sorted keys. VLLM names one worker's
// blocks of one KV-cache group there: the rank directory is the namespace,
// VLLMLayout{Group} the layout, FormatRaw the format, keys the block
// hashes. VLLMLayout's temporary files are <path>_<digits>.tmp, as vLLM's
// are, so Clean removes vLLM's stale ones and vLLM-side clean-up ours.
// NewVLLM derives the base directory from a run config (with vLLM's
// parallel-agnostic rule), WriteConfig writes config.json byte for byte as
// vLLM does, FindVLLMBase and ResolveVLLM find an existing one.
//
// # Durability
//
// DurabilityNone, the default, does not fsync. That is safe for a cache:
// after a power loss an un-synced block may be missing, empty, or hold
// garbage, and the checksums turn that into a miss (ErrCorrupt), never into
// wrong data; the block is simply computed again. DurabilityData fsyncs the
// file before the rename, so a block found after a crash is whole.
// DurabilityFull also fsyncs the directory after the rename (and a new
// fan-out directory's parent), so a block survives once Put returns. A
// directory fsync that fails fails the Put with the block already
// published: it is whole and valid, but may not survive a power loss.
//
// # Maintenance
//
// Scan streams every block's metadata; Verify reads and checks every block
// and reports, quarantines or removes corrupt ones; Clean removes old
// temporary files; Usage totals blocks and bytes per namespace. All walk
// the tree a directory batch at a time, in constant memory, and may run
// while other goroutines and processes use the store. For eviction while
// serving, an Index keeps every block's size and recency in memory after
// one scan and re-reads only directories that changed, and a Lease (a lock
// on a file in the directory) makes one process among those sharing it the
// one that evicts; the tier's evictor uses both.
//
// # Threading and memory
//
// A Store is safe for concurrent use; it holds no file descriptors, only
// its configuration and the set of directories known to exist (guarded by
// a RWMutex). The format functions and Layout methods are pure: they keep
// no reference to the caller's slices, except that Header.Key aliases the
// buffer passed to DecodeHeader. Get reads into the caller's buffer and
// does not keep it.
package blockstore
