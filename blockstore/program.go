package blockstore

import (
	"bytes"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The block protocol as data. What a lookup, load or store does on disk —
// which system calls, on which paths and buffers, linked how, and what
// their results mean — is written once, here, as a Program: a short list
// of Steps per phase, and a judgement (Program.Judge) of their results
// that either decides the outcome or lays out the next phase. An engine
// only executes steps: RunSync with plain system calls (Put, Get and the
// tier's sync engine), the tier's io_uring engine with one SQE per step.
// So both engines follow the same protocol by construction, and the
// protocol can be tested without a kernel by filling in results.
//
// Links mirror io_uring's: after a step linked LinkOnSuccess fails (a
// negative result, or a read or write that moved less than it asked), the
// rest of its chain does not run and each such step's result is
// -ECANCELED; a step linked LinkAlways lets the chain go on whatever it
// returned. A phase is one chain or several; its last step is LinkNone.
//
//	lookup: STATX, or an OPEN with O_PATH that is a Probe (no symlink followed; anything
//	        else at the path may be a block, for a load to judge); RESOLVE_CACHED first, with
//	        O_DIRECTORY (ENOTDIR: found), and STATX if the dentry cache cannot answer
//	load:   OPEN ─ READV [header,] payload, past the block's end ═ CLOSE
//	        or, without memory to read past the end with them, or with Config.AsyncDirectReads:
//	        OPEN ─ READ past the block's end ═ [READ the block's last page, for its count ═]
//	        READV header, payload ═ CLOSE (a raw block: as below)
//	        or, for a block bigger than one read, or after a READV that ended before the
//	        payload did: OPEN ─ READ past the block's end ═ [READ the block's last page ═]
//	        [READ header ─] READ payload ─ … ─ CLOSE
//	        or, for a framed block through the page cache bigger than Config.SumChunk: OPEN ─
//	        READ past the block's end ═ READ header ─ READ the first part, then a phase a part:
//	        READ the next part [─ CLOSE after the last], each Judge checksumming the part just read
//	        then for a short read: READ the rest ─ … ─ CLOSE; for an open or read that fails
//	        oddly or a file shorter than the format's least (a header; a raw block): STATX
//	        (what is there?); for a corrupt block, as Config.Corrupt says: OPEN its directory,
//	        then RENAME into quarantine, or UNLINK it, beneath that ═ CLOSE, or nothing; for ESTALE on the open or a read, or ENOENT
//	        on a read (another host replaced or removed the file: NFS, GlusterFS): [CLOSE,
//	        then] the first phase again, once, then missing
//	store:  [raw: STATX block, then nothing more if a block of the right size is there]
//	        [MKDIR aa ═ OPEN aa ─ CLOSE ─ MKDIR aa/bb ═ OPEN aa/bb ─ CLOSE ─] OPEN tmp (O_CREAT|O_EXCL)
//	        ─ WRITEV [header,] payload [─ FSYNC] ─ CLOSE ─ RENAME tmp → block, the directories
//	        only in directories not seen yet where a first try's OPEN found a level missing,
//	        not a directory or a link; for a block bigger than one write: [WRITE header ─]
//	        WRITE payload ─ …; then for a short write: WRITE the rest ─ … ─ CLOSE ─ RENAME; on failure: UNLINK tmp;
//	        for DurabilityFull: OPEN dir ─ FSYNC ═ CLOSE for the block's directory (and its parents if created or not known)
//	delete: OPEN the block's directory, then UNLINK block beneath it ═ CLOSE (a reader that opened
//	        the block first reads it whole: the file lives until closed)
//	(─ LinkOnSuccess, ═ LinkAlways; [header] in the framed format only)
//
// The READ past the block's end finds nothing in a valid block file: it is
// how a reader that does not fstat learns that bytes were appended. The
// store's RENAME is linked behind every write, the FSYNC and the CLOSE
// (which on NFS reports deferred write errors), so a failed store never
// creates or replaces a block. Opens resolve beneath the namespace
// directory without following any symlink, and loads open with O_NONBLOCK,
// so a FIFO at a block path reads as empty instead of blocking; whatever
// is not a regular file there is corrupt. MKDIR follows links on the way,
// so the store opens each directory it makes without following links: a
// link there stops the chain before anything is made beneath it. UNLINK
// and RENAME follow links on the way too, and io_uring gives them no fixed
// file: a delete and a load's disposal of a corrupt block first open the
// block's directory into an ordinary descriptor (a Keep step) and act on
// the file's name beneath it, so a link planted in place of a directory
// makes the block missing instead of someone else's file removed or moved.

// Op is what a Program does.
type Op uint8

// Operations.
const (
	OpLookup Op = iota // is there a block for the key
	OpLoad             // read and verify the block into the buffer
	OpStore            // publish the buffer as the block
	OpDelete           // remove the block
)

// StepOp is a step's system call.
type StepOp uint8

// Step operations: each is one system call, and one io_uring opcode.
const (
	StepStatx  StepOp = iota // statx(dir, Path, AT_SYMLINK_NOFOLLOW|AT_STATX_DONT_SYNC, TYPE|SIZE, &Stx)
	StepOpen                 // openat2(dir, Path, How): the program's file (with Keep, its directory's descriptor)
	StepRead                 // pread(file, Buf, Off)
	StepReadv                // preadv(file, Vec, Off)
	StepWrite                // pwrite(file, Buf, Off)
	StepFsync                // fdatasync(file), or fsync for a directory
	StepClose                // close(file) (with Keep, of the directory's descriptor)
	StepMkdir                // mkdirat(dir, Path, 0755)
	StepRename               // renameat(dir, Path, dir or AT_FDCWD when Abs2, Path2); with AtDir, from DirFD
	StepUnlink               // unlinkat(dir, Path, 0); with AtDir, unlinkat(DirFD, Path, 0)
	StepWritev               // pwritev(file, Vec, Off)
)

var stepOpNames = [...]string{"statx", "openat", "read", "readv", "write", "fsync", "close", "mkdirat", "renameat", "unlinkat", "writev"}

// String returns the system call's name, as errors name it.
func (o StepOp) String() string { return stepOpNames[o] }

// Link says whether the step after this one runs.
type Link uint8

// Links (IOSQE_IO_LINK and IOSQE_IO_HARDLINK, io_uring_enter(2)).
const (
	LinkNone      Link = iota // the chain ends here
	LinkOnSuccess             // the next step runs only if this one succeeded in full
	LinkAlways                // the next step runs whatever this one returned
)

// role is what a step's result means to the judgement.
type role uint8

const (
	roleLookup role = iota
	roleOpen
	roleTail  // a read past the end of a block of the expected size
	roleLast  // a read of the last page of a block of the expected size, for its count alone (Config.AsyncDirectReads)
	roleBody  // a vectored read of header and payload, the read past the end apart
	roleWhole // a read of header, payload and past the end (vectored, or in the frame), or a vectored write of header and payload
	roleHeader
	rolePayload
	roleDirSync // fsync of a directory: Path names it
	roleSync
	roleClose
	roleMkdir
	roleDirCheck // a store's check that a directory it creates under is not a link
	roleType     // a load's STATX of whatever odd thing is at the block's path
	rolePublish
	roleQuarantine
	roleUnlink
	roleExists // a raw store's STATX of the block: is one there already
	roleRemove // a load's UNLINK of a corrupt block (CorruptRemove)
	roleDelete // a delete's UNLINK of the block
	roleLeaf   // the open of the block's directory, for an UNLINK or RENAME of the block in it
)

// Step is one system call of a program's phase. The executor fills Res;
// everything else is the protocol's.
type Step struct {
	Op    StepOp
	Link  Link
	Path  *byte         // NUL-terminated, relative to the namespace directory, in the program's memory
	Path2 *byte         // a rename's target
	Abs2  bool          // Path2 is absolute: renameat's new directory is AT_FDCWD
	How   *unix.OpenHow // an open's flags, mode and RESOLVE_* flags
	// Probe marks an open that only asks whether the path resolves
	// (O_PATH): the file is not the program's, and the executor closes it
	// when it likes. RunSync closes it at once; the io_uring engine leaves
	// it in the op's fixed-file slot, where the next open replaces it, and
	// empties such slots when it goes idle: a linked CLOSE would cost a
	// request and a completion per lookup.
	Probe bool
	// Keep marks the open of the block's directory into an ordinary
	// descriptor (its result), which the program keeps in DirFD for the
	// next phase's steps with AtDir, and the close of that descriptor.
	// An UNLINK or RENAME follows links on the way to the last component
	// and takes no fixed file in io_uring: run beneath a directory that
	// an open which follows no link found, it cannot act outside the
	// namespace directory, whatever stands in place of a directory since.
	Keep  bool
	AtDir bool         // Path is relative to DirFD (the base name of the block), not to the namespace directory
	Buf   []byte       // a read's or write's memory
	Vec   []unix.Iovec // a vectored read's or write's memory, in the program's memory
	Off   int64        // a read's or write's file offset
	Res   int32        // the result: what the system call returned, or -errno
	Data  bool         // an FSYNC of file data only (fdatasync): the file is new, its size is data
	role  role
	dir   uint16 // a MKDIR's or directory FSYNC's path: its offset in the program's dirs
}

// At returns the directory descriptor s's Path resolves beneath: p's
// DirFD for an AtDir step, else dir (the namespace directory's).
func (s *Step) At(p *Program, dir int) int {
	if s.AtDir {
		return p.DirFD
	}
	return dir
}

// Failed reports whether the step did not succeed in full: an error, or
// a read or write that moved less than it asked. It is when LinkOnSuccess
// stops a chain.
func (s *Step) Failed() bool { return s.Res < 0 || int64(s.Res) < s.Asked() }

// Asked is the bytes a read or write asks to move, 0 for other steps: what
// it returns when it succeeds in full.
func (s *Step) Asked() int64 {
	switch s.Op {
	case StepRead, StepWrite:
		return int64(len(s.Buf))
	case StepReadv, StepWritev:
		return s.VecLen()
	}
	return 0
}

// VecLen is the bytes a vectored read or write asks for.
func (s *Step) VecLen() int64 {
	n := int64(0)
	for _, v := range s.Vec {
		n += int64(v.Len)
	}
	return n
}

// Status is a program's outcome.
type Status uint8

// Outcomes.
const (
	StatusPending Status = iota
	StatusFound          // lookup: a regular file is at the block's path
	StatusMissing        // lookup or load: no block
	StatusLoaded         // load: Buf holds the verified payload
	StatusStored         // store: the block is published
	StatusCorrupt        // load: the file is not a valid block of this key and size
	StatusFailed         // the filesystem failed an operation; Err says which
	StatusPresent        // store (raw format): a block was there already; nothing written
	StatusDeleted        // delete: the block was removed
)

// Limits of a program.
const (
	StepsMax  = 16  // steps in one phase
	ChunksMax = 4   // payload reads or writes in one phase
	PathMax   = 256 // a path beneath the namespace directory, with its NUL

	// ScratchSize is what a program's hdr memory should be: a header
	// and room for a load's read past the block's end.
	ScratchSize = 2 * HeaderSize

	quarantinePathMax = 1024 // an absolute quarantine path, with its NUL
)

// RWMax is the most bytes one read or write asks for: the kernel moves at
// most MAX_RW_COUNT (INT_MAX rounded down to a page, include/linux/fs.h)
// per call and reports a short count past it. A variable so that tests can
// make small blocks span many chunks and phases.
var RWMax = 0x7ffff000

// ResolveBeneath keeps every open inside the namespace directory and off
// symlinks (openat2(2)): in a directory shared by tenants, a planted link
// must not make a reader or writer touch someone else's file.
const ResolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS

// resolveCached is RESOLVE_CACHED (Linux 5.12, older than any kernel
// with the io_uring opcodes the tier needs), which x/sys/unix lacks:
// resolve from the dentry cache or fail EAGAIN.
const resolveCached = 0x20

type phase uint8

const (
	phaseMain phase = iota
	phaseResume
	phaseQuarantine
	phaseCleanup
	phaseDirSync
	phaseClose // decided, but the file is still open: close it first
	phaseType  // a load met something odd: STATX says whether a regular file is there
	phaseExists
	phaseRemove
	phaseWalk // a lookup by open that the dentry cache could not answer: STATX
	phaseLeaf // before an UNLINK or RENAME of the block: open its directory (Keep)
)

// DirCache remembers which of a namespace's directories exist, so a store
// issues MKDIRs only for directories it has not seen. Keys are directory
// paths relative to the namespace directory. The io_uring engine's owner
// keeps a plain map; Store keeps one behind a lock.
type DirCache interface {
	Known(dir []byte) bool
	Remember(dir []byte)
	Forget(dir []byte)
}

// DirGuess learns whether a store's directories that its engine has not
// seen yet are usually there (a tree filled before: by other processes,
// or by this one before a restart) or usually missing (a new tree). A
// store tries first without its MKDIRs where they are usually there, and
// makes and checks them first where they are usually missing: a first try
// that does not find them costs an open and a second phase. Each such
// first try, and each store that made its directories first (MKDIR says
// EEXIST where one was there), moves a counter of the recent misses up or
// down; at guessMake or more, stores make them first. Safe for concurrent
// use.
type DirGuess struct{ misses atomic.Int32 }

// The counter's bound and the count at which stores make directories
// first: more misses than finds in the last stores that told.
const guessMax, guessMake = 16, 8

func (g *DirGuess) makeFirst() bool { return g != nil && g.misses.Load() >= guessMake }

func (g *DirGuess) note(there bool) {
	if g == nil {
		return
	}
	for {
		n := g.misses.Load()
		m := min(n+1, guessMax)
		if there {
			m = max(n-1, 0)
		}
		if m == n || g.misses.CompareAndSwap(n, m) {
			return
		}
	}
}

// Program is one block operation in flight: its memory (paths, header,
// open flags, statx buffer) and its current phase's steps. Once a step is
// with the kernel, the program must not move or be reused until that
// step's result is in: keep programs in a slice allocated once.
type Program struct {
	// Every judgement reads these and the first steps: in one cache line
	// with the steps' start.
	Op       Op
	Status   Status // the outcome, once Judge returns true
	Canceled bool   // the caller gave up: no retry, no resume
	Renew    bool   // a store found a directory gone and tries again: the engine may reopen the namespace directory first
	N        int    // steps in the current phase
	Err      error  // why, for StatusCorrupt and StatusFailed
	Steps    [StepsMax]Step
	Stx      unix.Statx_t
	How      unix.OpenHow // the open of the phase's file; the kernel reads it when the step is submitted
	DirHow   unix.OpenHow // a store's directory checks, submitted with its open
	Key      [KeySizeMax]byte
	KeyLen   uint8
	DirFD    int // the block's directory, opened by a Keep step: AtDir steps resolve beneath it

	progress // reset by Start; the buffers below are written before they are read

	path  [PathMax]byte // the block, NUL-terminated
	tmp   [PathMax]byte // a store's temporary file
	dirs  [PathMax]byte // directories to create or sync, each NUL-terminated
	qpath [quarantinePathMax]byte
	iov   [3]unix.Iovec // a load's vectored read (header, payload, past the end), a store's write (header, payload)
}

// progress is a program's state between phases: small, so that Start
// resets it without clearing the kilobytes of path buffers on every op.
type progress struct {
	cfg      *Config
	buf      []byte // the payload
	hdr      []byte // HeaderSize bytes, aligned where O_DIRECT is used
	past     []byte // HeaderSize bytes after hdr, for a vectored read past the block's end; or nil
	frame    []byte // hdr, buf and past as one piece of memory (Start), or nil
	direct   bool
	phase    phase
	fileOpen bool
	dirOpen  bool          // DirFD is open
	leafNext phase         // the phase the block's directory was opened for
	created  bool          // a store made directories (their parents need a sync for DurabilityFull)
	unseen   bool          // a store's directory was not known when it began: maybe new, its creator's sync of its parents not yet run
	retried  bool          // a store already recreated its directories once; a load already met a stale file once
	mkdirs   bool          // a store makes and checks its directories (its first try did not find them)
	tryDirs  bool          // a store's phase counts on directories it has not seen being there
	guessed  bool          // a store makes directories it has not seen first, as Config.Guess said
	reopen   bool          // a load closes a stale file and walks the path again
	eof      bool          // a load's read met the end of the file
	byStep   bool          // a load reads header, payload and past the end with a read each
	moveAway bool          // a load's verdict, kept through its type check: dispose of the file
	disposal CorruptAction // what a load did with the file: CorruptQuarantine or CorruptRemove, once tried
	dispErr  error         // and this is why it could not
	tail     int32         // bytes a load found past the end of a block of the expected size
	tailFull bool          // the read past the end filled its buffer: the file may be longer still
	short    bool          // the read of the block's last page found nothing: the file ends before it (Config.AsyncDirectReads)
	hdrDone  int64
	payDone  int64
	summed   int64  // of payDone, the bytes in sum (Config.SumChunk)
	sum      uint32 // their checksum
	cause    error
	fd       int // the file, for RunSync
}

// Config is what every program of one namespace shares. Immutable once
// programs use it.
type Config struct {
	Layout       Layout
	Format       Format // how a block sits in its file
	Durability   Durability
	Corrupt      CorruptAction // what a load does with a corrupt file; CorruptDefault is the format's choice
	Dir          string        // the namespace directory, absolute: errors name paths under it
	Quarantine   string        // where CorruptQuarantine moves corrupt blocks, absolute; "" leaves them in place
	Namespace    string        // names quarantined files
	Dirs         DirCache      // directories known to exist
	Guess        *DirGuess     // shared: whether directories not seen yet are usually there; nil: always try first
	LookupByOpen bool          // lookups open the path with O_PATH (a Probe) instead of statx
	// LookupCachedFirst makes those opens RESOLVE_CACHED: a path the
	// dentry cache cannot resolve fails EAGAIN at once, and the lookup
	// asks STATX instead, which the io_uring engine runs in a kernel
	// worker. An O_PATH open that misses the cache goes to a worker as
	// well, and there answered a sixth fewer keys a second (caches
	// dropped, 16,384 keys half present, ext4, a ring per CPU on 2 CPUs,
	// tier.BenchmarkLookupCold: 51 k against 61 k at the median of 6
	// interleaved rounds). Like every STATX lookup (and the sync
	// engine's), the walk then follows a link in place of a directory.
	// For local filesystems only: on FUSE and NFS a STATX can cost a
	// GETATTR round trip that the open does not.
	LookupCachedFirst bool
	// AsyncDirectReads says that an O_DIRECT read of a FUSE file may
	// complete asynchronously (io_uring's kernel workers issue it so), and
	// then the kernel, which shortens a read past the end of the file to
	// whole pages before sending it, reports one that it shortened and the
	// server answered in full as having read all it asked (Linux 6.18
	// with go-fuse's server: a raw block cut by a page loaded as whole;
	// linux_test TestShortBlocksThroughFUSE). A read that ends within the
	// page the file ends in, or starts past the end, is counted right, so
	// an O_DIRECT load then reads the block's last page apart first: if
	// that finds nothing, the file is shorter than a block whatever the
	// other reads say, and a STATX sizes it. One read more a load, of a
	// page.
	AsyncDirectReads bool
	// SumChunk, when more than 0, has a framed load through the page cache
	// whose payload is bigger read it SumChunk bytes a phase, and its Judge
	// checksum each part as it comes, while the copy has left it in the
	// CPU's cache: a payload bigger than that cache is otherwise read
	// back from memory by the checksum after its copy. One phase more a
	// part, a read each instead of one (RWMax still bounds a read).
	SumChunk int
}

// Walking reports whether a lookup by RESOLVE_CACHED open found its path
// outside the dentry cache and asks STATX instead (its second phase).
func (p *Program) Walking() bool { return p.phase == phaseWalk }

// Sums reports how many payload bytes the next Judge may checksum that the
// phase's reads just copied through the CPU: a framed load's read phase,
// not O_DIRECT. Its Judge then costs a good part of what the copy did
// (CRC32C, 50 GB/s over a payload in the cache here), so that an engine
// may run it away from the thread that drives the kernel. Judge writes
// nothing outside p.
func (p *Program) Sums() int {
	switch {
	case p.Op != OpLoad || p.direct || p.cfg.Format == FormatRaw || p.phase != phaseMain && p.phase != phaseResume:
		return 0
	case p.sumsParts():
		return p.cfg.SumChunk
	}
	return len(p.buf)
}

// sumsParts reports whether a load reads its payload Config.SumChunk
// bytes a phase and checksums each part as it comes.
func (p *Program) sumsParts() bool {
	return p.Op == OpLoad && !p.direct && p.cfg.Format == FormatFramed && p.cfg.SumChunk > 0 && len(p.buf) > p.cfg.SumChunk
}

// KeyBytes returns the program's key.
func (p *Program) KeyBytes() []byte { return p.Key[:p.KeyLen] }

// Disposal is what a load did with a block file it judged corrupt.
type Disposal struct {
	Action CorruptAction // CorruptQuarantine or CorruptRemove
	Rel    []byte        // the block's path under the namespace directory; the program's memory
	Dst    []byte        // CorruptQuarantine: where the file was to go; the program's memory
	Err    error         // why it could not be done; nil: done
}

// Disposed reports whether a decided load tried to quarantine or remove
// its file, and how that went.
func (p *Program) Disposed() (Disposal, bool) {
	if p.disposal != CorruptQuarantine && p.disposal != CorruptRemove {
		return Disposal{}, false
	}
	d := Disposal{Action: p.disposal, Rel: cstr(p.path[:]), Err: p.dispErr}
	if p.disposal == CorruptQuarantine {
		d.Dst = cstr(p.qpath[:])
	}
	return d, true
}

// corrupt is the action in force for corrupt files.
func (c *Config) corrupt() CorruptAction {
	a := c.Corrupt.Resolve(c.Format)
	if a == CorruptQuarantine && c.Quarantine == "" {
		return CorruptLeave
	}
	return a
}

// cstr cuts b at its first NUL.
func cstr(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// Check reports whether programs of this configuration stay within their
// limits for every key: each phase within StepsMax steps, each path within
// PathMax bytes. A caller checks once, before the first Start, so that no
// limit is met while a program runs.
func (c *Config) Check() error {
	key := bytes.Repeat([]byte{0xff}, KeySizeMax)
	path := c.Layout.AppendPath(nil, key)
	tmp := c.Layout.AppendTempPath(nil, key, ^uint64(0))
	dir := c.Layout.AppendDir(nil, key)
	levels := 0
	if len(dir) > 0 {
		levels = 1 + bytes.Count(dir, []byte{'/'})
	}
	store := 3*levels + 5 + ChunksMax // MKDIR+OPEN+CLOSE a level; OPEN, header WRITE, FSYNC, CLOSE, RENAME
	if c.Format > FormatRaw || c.Corrupt > CorruptQuarantine {
		return fmt.Errorf("%w: format %v, corrupt-block action %v", ErrInvalidOptions, c.Format, c.Corrupt)
	}
	quarantine := len(c.Quarantine) + 1 + len(c.Namespace) + 1 + 2*KeySizeMax + 1 + 20
	switch {
	case len(path) >= PathMax || len(tmp) >= PathMax || 2*len(dir)+2 > PathMax:
		return fmt.Errorf("%w: the layout's paths take up to %d bytes, more than %d", ErrInvalidOptions, max(len(path), len(tmp), 2*len(dir)+2), PathMax-1)
	case store > StepsMax || 3*(levels+1) > StepsMax:
		return fmt.Errorf("%w: the layout's %d directory levels need %d steps in a phase, more than %d", ErrInvalidOptions, levels, store, StepsMax)
	case c.corrupt() == CorruptQuarantine && quarantine >= quarantinePathMax:
		return fmt.Errorf("%w: quarantine paths of %d bytes, more than %d", ErrInvalidOptions, quarantine, quarantinePathMax-1)
	case len(dir) > 0 && (!bytes.HasPrefix(path, dir) || path[len(dir)] != '/' || bytes.IndexByte(path[len(dir)+1:], '/') >= 0),
		len(dir) == 0 && bytes.IndexByte(path, '/') >= 0:
		return fmt.Errorf("%w: the layout's path %q is not a name in its directory %q", ErrInvalidOptions, path, dir)
	}
	return nil
}

// probeHow is the open of a lookup resolved from the dentry cache alone
// (Config.LookupCachedFirst). O_DIRECTORY: a block's file is no
// directory, so the open of one that is there ends in ENOTDIR once the
// walk has found it, and no file is opened, installed and later freed
// (warm lookups, a ring per CPU: 1.17x the keys a second). Only with
// RESOLVE_CACHED does ENOTDIR name the last component alone: a walk that
// meets a file in place of a directory on the way leaves the dentry
// cache's RCU walk and fails with EAGAIN, and STATX, asked next, tells the
// two apart (tier.TestFileInPlaceOfFanoutDir). The kernel only reads it.
var probeHow = unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY, Resolve: ResolveBeneath | resolveCached}

// Probe readies p for the one open that, most often, is all of a lookup
// that cfg makes by an open resolved from the dentry cache alone
// (LookupByOpen and LookupCachedFirst), without the rest of Start: it
// writes key's path into p's memory and returns it and the open's flags,
// as Start would lay them. The engine submits openat2 of them beneath the
// namespace directory and gives the result to ProbeVerdict; if that does
// not decide, the engine calls Start and hands the same result to its
// first step, the same open, and the program goes on from there. ok is
// false when cfg makes lookups otherwise, or the path is too long (Start
// says so). A cancel sees one step.
func (p *Program) Probe(cfg *Config, key []byte) (path *byte, how *unix.OpenHow, ok bool) {
	if !cfg.LookupByOpen || !cfg.LookupCachedFirst {
		return nil, nil, false
	}
	n := len(cfg.Layout.AppendPath(p.path[:0], key)) // in p.path when it fits
	if n >= len(p.path) {
		return nil, nil, false
	}
	p.path[n] = 0
	p.Op, p.N, p.Canceled = OpLookup, 1, false
	return &p.path[0], &probeHow, true
}

// ProbeVerdict decides a lookup from the result of Probe's open where the
// open alone decides it, as Judge does: ENOTDIR, something other than a
// directory is there; ENOENT, ELOOP (a symlink on the way) or ESTALE,
// nothing. Otherwise (EAGAIN: a path outside the dentry cache; an open
// that succeeded, and installed a directory; another error) ok is false.
func ProbeVerdict(res int32) (st Status, ok bool) {
	switch res {
	case -int32(unix.ENOTDIR):
		return StatusFound, true
	case -int32(unix.ENOENT), -int32(unix.ELOOP), -int32(unix.ESTALE):
		return StatusMissing, true
	}
	return StatusPending, false
}

// Start lays out the first phase of op on key. buf is the payload of a
// load or store (the caller's memory, kept until the program is decided);
// hdr is HeaderSize bytes of the program's own, aligned for O_DIRECT, or
// ScratchSize, which lets a load read header, payload and past the
// block's end with one vectored read; or buf's frame: HeaderSize bytes
// before buf, buf and HeaderSize bytes after it, all one piece of memory
// (hdr[HeaderSize:] starts at buf), so that a load reads header, payload
// and past the end with one plain read (an engine may then read into a
// registered buffer, whose pages the kernel need not pin as it pins each
// iovec's).
// direct asks loads and stores to bypass the page cache (O_DIRECT: buf
// and hdr aligned to HeaderSize).
func (p *Program) Start(cfg *Config, op Op, key, buf, hdr []byte, direct bool) error {
	p.Op, p.N, p.Status, p.Err, p.Canceled, p.Renew = op, 0, StatusPending, nil, false, false
	p.progress = progress{cfg: cfg, buf: buf, hdr: hdr, direct: direct, fd: -1}
	p.DirFD = -1
	if len(buf) > 0 && len(hdr) == len(buf)+2*HeaderSize && &hdr[HeaderSize] == &buf[0] {
		p.frame = hdr
		p.hdr, p.past = hdr[:HeaderSize:HeaderSize], hdr[HeaderSize+len(buf):]
	} else if len(hdr) >= ScratchSize {
		p.hdr, p.past = hdr[:HeaderSize:HeaderSize], hdr[HeaderSize:ScratchSize:ScratchSize]
	}
	if op == OpStore && cfg.Format == FormatRaw {
		p.phase = phaseExists // a raw store skips a block that is there
	}
	p.KeyLen = uint8(copy(p.Key[:], key))
	path := append(cfg.Layout.AppendPath(p.path[:0], key), 0)
	if len(path) > len(p.path) {
		return fmt.Errorf("%w: block path of %d bytes, more than %d", ErrInvalidKey, len(path), PathMax-1)
	}
	if op == OpStore && cfg.Format == FormatFramed {
		// Once, not per try: the checksum reads the whole payload (0.9
		// ms of CPU for 2 MiB here), and a store into a directory not
		// seen yet often tries twice.
		EncodeHeader(p.hdr, key, buf)
	}
	p.lay()
	return nil
}

// add appends a step to the phase.
func (p *Program) add(op StepOp, r role, link Link) *Step {
	if p.N == StepsMax {
		panic("blockstore: a phase needs more than StepsMax steps (a layout with deeper directories?)")
	}
	s := &p.Steps[p.N]
	*s = Step{Op: op, Link: link, role: r}
	p.N++
	return s
}

// lay lays out the steps of the current phase.
func (p *Program) lay() {
	p.N = 0
	switch {
	case p.phase == phaseClose:
		if p.fileOpen {
			p.add(StepClose, roleClose, LinkNone)
		}
		if p.dirOpen {
			p.add(StepClose, roleClose, LinkNone).Keep = true
		}
	case p.phase == phaseLeaf:
		// O_PATH: the directory is only a place to resolve beneath.
		dir := append(p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes()), 0)
		p.DirHow = unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: ResolveBeneath}
		s := p.add(StepOpen, roleLeaf, LinkNone)
		s.Path, s.How, s.Keep = &dir[0], &p.DirHow, true
	case p.Op == OpLookup && p.cfg.LookupByOpen && p.phase == phaseMain:
		p.How = unix.OpenHow{Flags: unix.O_PATH, Resolve: ResolveBeneath}
		if p.cfg.LookupCachedFirst {
			p.How = probeHow
		}
		s := p.add(StepOpen, roleLookup, LinkNone)
		s.Path, s.How, s.Probe = &p.path[0], &p.How, true
	case p.Op == OpLookup:
		p.add(StepStatx, roleLookup, LinkNone).Path = &p.path[0]
	case p.Op == OpLoad && p.phase == phaseMain:
		flags := uint64(unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY)
		if p.direct {
			flags |= unix.O_DIRECT
		}
		p.How = unix.OpenHow{Flags: flags, Resolve: ResolveBeneath}
		s := p.add(StepOpen, roleOpen, LinkOnSuccess)
		s.Path, s.How = &p.path[0], &p.How
		off := p.cfg.Format.PayloadOffset()
		unsure := p.direct && p.cfg.AsyncDirectReads
		parts := p.sumsParts()
		if !p.byStep && !parts && !unsure && p.past != nil && off+int64(len(p.buf))+HeaderSize <= int64(RWMax) {
			// One read for header, payload and past the end: a device
			// round trip (and a completion) instead of three. It closes
			// whatever it read; a read that ends before the payload does
			// is done again step by step (judgeLoad).
			if p.frame != nil {
				s = p.add(StepRead, roleWhole, LinkAlways)
				s.Buf = p.frame[HeaderSize-off:]
				p.add(StepClose, roleClose, LinkNone)
				break
			}
			n := 0
			for _, b := range [][]byte{p.hdr[:off], p.buf, p.past} {
				if len(b) > 0 {
					p.iov[n] = unix.Iovec{Base: &b[0], Len: uint64(len(b))}
					n++
				}
			}
			s = p.add(StepReadv, roleWhole, LinkAlways)
			s.Vec = p.iov[:n]
			p.add(StepClose, roleClose, LinkNone)
			break
		}
		// The header buffer first serves the read past the block's end;
		// the header read after it overwrites it. (A raw block has no
		// header: the buffer is the read's alone.)
		s = p.add(StepRead, roleTail, LinkAlways)
		s.Buf, s.Off = p.hdr, off+int64(len(p.buf))
		if unsure {
			s = p.add(StepRead, roleLast, LinkAlways)
			s.Buf, s.Off = p.hdr, off+int64(len(p.buf))-HeaderSize
		}
		if off > 0 && !p.byStep && !parts && off+int64(len(p.buf)) <= int64(RWMax) {
			// Header and payload with one read, as above but for the part
			// past the end, which has no memory here or cannot be read so
			// (Config.AsyncDirectReads): one read less, and through FUSE
			// one request and one asynchronous completion less.
			p.iov[0] = unix.Iovec{Base: &p.hdr[0], Len: uint64(off)}
			p.iov[1] = unix.Iovec{Base: &p.buf[0], Len: uint64(len(p.buf))}
			s = p.add(StepReadv, roleBody, LinkAlways)
			s.Vec = p.iov[:2]
			p.add(StepClose, roleClose, LinkNone)
			break
		}
		if off > 0 {
			// A short header read stops the chain, leaving the file open for
			// the next phase to read on (or, at its end, to judge).
			s = p.add(StepRead, roleHeader, LinkOnSuccess)
			s.Buf = p.hdr
		}
		p.layLoadRest()
	case p.Op == OpLoad && p.phase == phaseResume:
		if n := p.hdrDone; n < p.cfg.Format.PayloadOffset() {
			s := p.add(StepRead, roleHeader, LinkOnSuccess)
			s.Buf, s.Off = p.hdr[n:], n
		}
		p.layLoadRest()
	case p.Op == OpLoad && p.phase == phaseType:
		p.add(StepStatx, roleType, LinkNone).Path = &p.path[0]
	case p.Op == OpLoad && p.phase == phaseQuarantine:
		s := p.inLeaf(StepRename, roleQuarantine)
		s.Path2, s.Abs2 = &p.qpath[0], true
	case p.Op == OpLoad && p.phase == phaseRemove:
		p.inLeaf(StepUnlink, roleRemove)
	case p.Op == OpDelete && p.phase == phaseMain:
		p.viaLeaf(phaseRemove)
	case p.Op == OpDelete:
		p.inLeaf(StepUnlink, roleDelete)
	case p.Op == OpStore && p.phase == phaseExists:
		p.layExists()
	case p.Op == OpStore && p.phase == phaseMain:
		p.layStore()
	case p.Op == OpStore && p.phase == phaseResume:
		p.layStoreRest()
	case p.Op == OpStore && p.phase == phaseCleanup:
		p.add(StepUnlink, roleUnlink, LinkNone).Path = &p.tmp[0]
	case p.Op == OpStore && p.phase == phaseDirSync:
		p.layDirSync()
	default:
		panic(fmt.Sprintf("blockstore: no phase %d for op %d", p.phase, p.Op))
	}
	p.Steps[p.N-1].Link = LinkNone
}

// viaLeaf lays out phase ph, an UNLINK or RENAME of the block, after, in
// a layout with directories, a phase that opens the block's directory.
func (p *Program) viaLeaf(ph phase) {
	p.phase, p.leafNext = ph, ph
	if len(p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes())) > 0 && !p.dirOpen {
		p.phase = phaseLeaf
	}
	p.lay()
}

// inLeaf adds step op on the block: by its base name beneath DirFD, then
// DirFD's close, when a phase opened the block's directory; else by its
// path beneath the namespace directory (a layout without directories).
func (p *Program) inLeaf(op StepOp, r role) *Step {
	s := p.add(op, r, LinkAlways)
	s.Path = &p.path[0]
	if p.dirOpen {
		n := len(p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes()))
		s.Path, s.AtDir = &p.path[n+1], true
		p.add(StepClose, roleClose, LinkNone).Keep = true
	}
	return s
}

// judgeLeaf judges the open of the block's directory: on to the phase it
// was opened for, or, if it could not be opened, the outcome.
func (p *Program) judgeLeaf() bool {
	r := p.Steps[0].Res
	switch {
	case r >= 0:
		p.next(p.leafNext)
		return false
	case p.Op == OpDelete && (r == -int32(unix.ENOENT) || r == -int32(unix.ESTALE) || r == -int32(unix.ELOOP)):
		// No block there for us; a link in place of a directory (ELOOP)
		// leads elsewhere, as for a lookup.
		return p.decide(StatusMissing, nil)
	case p.Op == OpDelete:
		return p.decide(StatusFailed, p.pathError(StepOpen, p.dirs[:], syscall.Errno(-r)))
	}
	p.disposal, p.dispErr = CorruptQuarantine, syscall.Errno(-r)
	if p.leafNext == phaseRemove {
		p.disposal = CorruptRemove
	}
	return p.decide(p.Status, p.Err)
}

// layChunks adds reads or writes (op) of the payload from payDone, at most
// ChunksMax of them (a load's part: one read of Config.SumChunk), each
// linked to the next, and returns where they end.
func (p *Program) layChunks(op StepOp) int64 {
	done, n, size := p.payDone, ChunksMax, RWMax
	if op == StepRead && p.sumsParts() {
		n, size = 1, min(size, p.cfg.SumChunk) // one part a phase, for Judge to checksum
	}
	for range n {
		if done == int64(len(p.buf)) {
			break
		}
		s := p.add(op, rolePayload, LinkOnSuccess)
		s.Buf, s.Off = chunk(p.buf, done, size), p.cfg.Format.PayloadOffset()+done
		done += int64(len(s.Buf))
	}
	return done
}

// chunk returns the part of buf from done that one read or write of at
// most size bytes moves.
func chunk(buf []byte, done int64, size int) []byte {
	return buf[done:min(int64(len(buf)), done+int64(size))]
}

// Judge takes the results of the phase's steps. It returns true when the
// outcome is decided (Status, Err); otherwise it has laid out the next
// phase, for the engine to execute.
func (p *Program) Judge() bool {
	for k := range p.N {
		s := &p.Steps[k]
		switch {
		case s.Op == StepOpen && s.Res >= 0 && s.Keep:
			p.DirFD, p.dirOpen = int(s.Res), true
		case s.Op == StepClose && s.Res != -int32(unix.ECANCELED) && s.Keep:
			p.DirFD, p.dirOpen = -1, false
		case s.Op == StepOpen && s.Res >= 0 && !s.Probe:
			p.fileOpen = true
		case s.Op == StepClose && s.Res != -int32(unix.ECANCELED):
			p.fileOpen = false // closed, or there was nothing to close
		}
	}
	if p.phase == phaseLeaf {
		return p.judgeLeaf()
	}
	if p.phase == phaseClose {
		if p.reopen {
			// The stale file is closed: walk the path again.
			p.reopen = false
			p.next(phaseMain)
			return false
		}
		return true
	}
	switch p.Op {
	case OpLookup:
		s := &p.Steps[0]
		if s.Op == StepOpen && p.How == probeHow {
			if st, ok := ProbeVerdict(s.Res); ok {
				return p.decide(st, nil) // ENOTDIR: something other than a directory, a block or not (below)
			}
			if s.Res == -int32(unix.EAGAIN) {
				p.next(phaseWalk)
				return false
			}
		}
		switch r := s.Res; {
		case r >= 0 && (s.Op != StepStatx || p.Stx.Mode&unix.S_IFMT != unix.S_IFLNK):
			// Something is there: whether it is a valid block (a regular
			// file with the key's header and checksum) is a load's
			// question, as for any corrupt block.
			return p.decide(StatusFound, nil)
		case r >= 0, r == -int32(unix.ENOENT), r == -int32(unix.ELOOP), r == -int32(unix.ESTALE):
			// A symlink at the path (or, for an open, on the way): no
			// block there. ESTALE: another host replaced or removed what
			// the path led to, and the kernel's own walk again (with
			// LOOKUP_REVAL) met it too: no block there for us.
			return p.decide(StatusMissing, nil)
		default:
			return p.decide(StatusFailed, p.pathError(s.Op, p.path[:], syscall.Errno(-r)))
		}
	case OpLoad:
		return p.judgeLoad()
	case OpDelete:
		switch r := p.Steps[0].Res; r {
		case 0:
			return p.decide(StatusDeleted, nil)
		case -int32(unix.ENOENT), -int32(unix.ESTALE):
			return p.decide(StatusMissing, nil)
		default:
			return p.decide(StatusFailed, p.pathError(StepUnlink, p.path[:], syscall.Errno(-r)))
		}
	}
	return p.judgeStore()
}

// decide sets the outcome, closing the file first if a broken chain left
// it open.
func (p *Program) decide(st Status, err error) bool {
	p.Status, p.Err = st, err
	if p.fileOpen || p.dirOpen {
		p.next(phaseClose)
		return false
	}
	return true
}

func (p *Program) next(ph phase) {
	p.phase = ph
	p.lay()
}

// pathError wraps errno for rel (NUL-terminated) under the namespace
// directory, as package os does, so errors.Is(err, fs.ErrNotExist) works.
func (p *Program) pathError(op StepOp, rel []byte, errno syscall.Errno) error {
	return &fs.PathError{Op: op.String(), Path: filepath.Join(p.cfg.Dir, string(cstr(rel))), Err: errno}
}
