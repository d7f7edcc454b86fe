package blockstore

import (
	"bytes"
	"io/fs"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Index is the usage and recency of one namespace's blocks, in memory.
// One full Scan builds it; after that Refresh stats every directory and
// re-reads only those whose modification time (or inode) changed, so an
// online evictor never walks the whole tree again. A directory's mtime
// changes when a block is created, replaced (rename) or removed in it, not
// when one is read: reads show up through RecheckAll, which an evictor calls
// on each victim before removing it.
//
// Threading: Scan, Refresh, Victims, RecheckAll and Forget must be called
// from one goroutine at a time (the evictor's); Usage may be called from
// any goroutine at any time. The index uses plain system calls (getdents,
// statx), never io_uring.
//
// Memory: per block one 16-byte entry (key offset, recency in seconds,
// size) plus the key's bytes, in two exact-size slices per directory; per
// directory one record (its path, mtime, inode, slices) and a map entry.
// Reading a directory allocates two short-lived objects per block (the
// path handed to KeyFromPath and the key it returns) and its two slices.
// A directory holds at most 4 GiB of keys (entries' offsets are uint32):
// 67 M blocks in one directory.
//
// A directory's mtime is trusted only once it is older than two seconds
// when read (see Refresh); on NFS that assumes the server's clock is
// within about a second of ours, and attribute caching can delay a change
// by up to the mount's acdirmax.
//
// Measured with BenchmarkIndexScan and BenchmarkIndexRefresh (go test
// -run '^$' -bench BenchmarkIndex ./blockstore): 200,000 blocks of 64
// bytes with 32-byte keys in 1,333 fan-out leaf directories (150 each, as
// at 10 M blocks; 1,590 directories in all), ext4 on a virtual disk, 2
// vCPUs, warm caches, an otherwise idle machine, refreshReaders readers:
//
//	heap per block          52.0 B (16 B entry + 32 B key + 4 B of directory records and size-class rounding)
//	Scan                    3,248 ns per block (one statx each; 2 allocations of transient garbage)
//	Refresh, unchanged      1,739 ns per directory (one statx each)
//	Refresh, 1% changed     5,001 ns per directory statted (13.4 leaves of 150 blocks read)
//	Victims of 1% of bytes  7.2 ns per block in the index
//
// (With one reader, on a loaded machine: 4,397, 2,157 and 8,466 ns.)
// Extrapolated to 10 M blocks in the fan-out layout (65,536 leaf
// directories + 256 + 1 = 65,793 directories):
//
//	memory               52.0 B × 10 M = 520 MB (twice that while a Scan replaces an index)
//	full Scan            3,248 ns × 10 M = 32 s
//	Refresh, unchanged   1,739 ns × 65,793 = 114 ms
//	Refresh, 1% changed  5,001 ns × 65,793 = 329 ms
//	Victims              7.2 ns × 10 M = 72 ms per call
type Index struct {
	s     *Store // immutable
	ns    string // immutable; valid
	nsDir string // absolute path of the namespace directory; immutable

	// epoch is the Unix second that recency 0 stands for; immutable.
	// Recency is kept as int32 seconds from it (±68 years).
	epoch int64

	// dirs are the directories read, parents before their children;
	// dirs[0] is the namespace directory itself (rel ""), kept even while
	// it does not exist. byRel maps a record's rel to its position.
	// Owned by the calling goroutine.
	dirs  []indexDir
	byRel map[string]int32

	// blocks and bytes are the live totals, read by Usage from any
	// goroutine, written only by the calling goroutine.
	blocks, bytes atomic.Int64

	// Scratch of the calling goroutine.
	path []byte     // a victim's path for an error, a layout's directory for locate
	own  *dirReader // reads directories when one reader suffices
}

// indexDir is one directory's record.
type indexDir struct {
	rel   string // path relative to the namespace directory, "" for itself
	mtime int64  // modification time in nanoseconds when read; 0: not read
	ino   uint64 // inode when read, 0: missing
	// dirty says the directory's mtime was younger than dirtyWindow when
	// it was read: a change in the same timestamp tick right after the
	// read would not move its mtime, so it is read again next Refresh.
	dirty bool
	gone  bool // vanished during this Refresh; dropped at its end

	// keys are the blocks' keys concatenated, in key order; entries[i]'s
	// key ends at entries[i].keyEnd and starts where entries[i-1]'s ends.
	// Both are allocated at their exact size when the directory is read
	// and never written after, except entries' used and size fields.
	keys    []byte
	entries []indexEntry
}

// indexEntry is one block: 16 bytes.
type indexEntry struct {
	keyEnd uint32 // end of the key in the directory's keys
	used   int32  // recency: max(atime, mtime) in seconds since the index's epoch
	size   int64  // file size in bytes; deadSize once forgotten
}

// deadSize marks a forgotten entry; it is dropped when its directory is
// next read.
const deadSize = -1

// scratchEntry is an entry being read, its key in Index.keys.
type scratchEntry struct {
	keyStart, keyEnd uint32
	used             int32
	size             int64
}

const (
	// dirtyWindow is how young a directory's mtime may be when it is read
	// and still be trusted not to change within its timestamp tick (a
	// jiffy on local filesystems, up to a second on some servers).
	dirtyWindow = 2 * time.Second
	// direntBufSize is the getdents buffer: about 1,000 block entries.
	direntBufSize = 64 << 10
	// progressBlocks is how often Scan reports progress.
	progressBlocks = 4096
	// indexBuckets is the resolution of Victims's recency histogram.
	indexBuckets = 1024
)

// NewIndex returns an empty index of namespace ns of s.
func (s *Store) NewIndex(ns string) (*Index, error) {
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	x := &Index{
		s:     s,
		ns:    ns,
		nsDir: s.root + "/" + ns,
		epoch: time.Now().Unix(),
	}
	x.reset()
	return x, nil
}

// reset makes the index empty: only the namespace directory's record,
// unread.
func (x *Index) reset() {
	x.dirs = []indexDir{{rel: ""}}
	x.byRel = map[string]int32{"": 0}
	x.blocks.Store(0)
	x.bytes.Store(0)
}

// Usage returns the blocks and bytes the index holds. Safe from any goroutine.
func (x *Index) Usage() (blocks, bytes int64) {
	return x.blocks.Load(), x.bytes.Load()
}

// Scan reads the whole namespace tree (replacing what the index held),
// calling progress (may be nil) every 4096 blocks or so and at the end
// with the running totals. A missing namespace directory is an empty
// namespace. On an error the index is left as it was.
func (x *Index) Scan(progress func(blocks, bytes int64)) error {
	oldDirs, oldByRel := x.dirs, x.byRel
	oldBlocks, oldBytes := x.Usage()
	x.reset()
	var last int64
	report := func() {
		if progress != nil {
			if b, n := x.Usage(); b-last >= progressBlocks {
				last = b
				progress(b, n)
			}
		}
	}
	_, _, err := x.refresh(report)
	if err != nil {
		x.dirs, x.byRel = oldDirs, oldByRel
		x.blocks.Store(oldBlocks)
		x.bytes.Store(oldBytes)
		return err
	}
	if progress != nil {
		progress(x.Usage())
	}
	return nil
}

// RefreshStats says what a Refresh did.
type RefreshStats struct {
	// Dirs is how many directories were statted.
	Dirs int
	// Changed is how many directories were read: changed, still within
	// the dirty window, or new.
	Changed int
	// Added is how many blocks were added.
	Added int64
	// Removed is how many blocks were removed, those of vanished
	// directories included (not those already Forgotten).
	Removed int64
}

// Refresh stats every directory the index knows and re-reads those whose
// mtime changed since they were read (new subdirectories are scanned
// whole, vanished ones dropped with their blocks). A directory whose mtime
// was younger than two seconds when it was read is read again, as its
// mtime may not show a change made in the same tick. On an error the
// directories handled so far are up to date and the rest as they were.
func (x *Index) Refresh() (RefreshStats, error) {
	var stats RefreshStats
	n, changed, err := x.refresh(nil)
	stats.Dirs, stats.Changed = n, changed.dirs
	stats.Added, stats.Removed = changed.added, changed.removed
	return stats, err
}

// changeCount counts what a refresh changed.
type changeCount struct {
	dirs           int
	added, removed int64
}

// refreshReaders is how many goroutines stat and read directories at
// once: on a network filesystem each call is a round trip, and the
// directories are independent. Measured on GlusterFS (BenchmarkIndex...
// and linux_test.TestEvictionAcrossProcesses), one reader spent 28 ms a
// changed directory under load.
const refreshReaders = 16

// refresh is Refresh, and Scan of an empty index; report (may be nil) is
// called after each directory read. It returns how many directories it
// statted. Readers stat and read directories in parallel; this goroutine
// alone changes the index, between their rounds.
func (x *Index) refresh(report func()) (statted int, c changeCount, err error) {
	defer x.compact()
	nsfd, err := openFile(x.nsDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		// The namespace is gone, and every directory in it.
		for i := range x.dirs {
			c.removed += x.drop(i)
		}
		return 1, c, nil
	}
	if err != nil {
		return 0, c, &fs.PathError{Op: "open", Path: x.nsDir, Err: err}
	}
	defer unix.Close(nsfd)
	// Round one: stat every directory known; changed ones are read.
	todo := make([]int, 0, len(x.dirs))
	for i := range x.dirs {
		todo = append(todo, i)
	}
	statted = len(todo)
	seen := x.run(nsfd, todo, (*dirReader).stat)
	todo = todo[:0]
	for _, r := range seen {
		switch {
		case x.dirs[r.i].gone:
		case r.vanished:
			c.removed += x.dropTree(r.i)
		case r.err != nil:
			return statted, c, r.err
		case r.changed:
			todo = append(todo, r.i)
		}
	}
	// Then read the changed directories, and the new subdirectories they
	// hold, a level at a time.
	for len(todo) > 0 {
		read := x.run(nsfd, todo, (*dirReader).read)
		todo = todo[:0]
		for k := range read {
			r := &read[k]
			switch {
			case x.dirs[r.i].gone:
				continue
			case r.vanished:
				c.removed += x.dropTree(r.i)
				continue
			case r.err != nil:
				return statted, c, r.err
			}
			x.install(r, &c)
			c.dirs++
			if report != nil {
				report()
			}
			for _, name := range r.subdirs {
				name = joinRel(x.dirs[r.i].rel, name)
				if _, ok := x.byRel[name]; !ok {
					x.dirs = append(x.dirs, indexDir{rel: name})
					x.byRel[name] = int32(len(x.dirs) - 1)
					todo = append(todo, len(x.dirs)-1)
				}
			}
		}
	}
	return statted, c, nil
}

// dirResult is what a reader learned of directory i.
type dirResult struct {
	i        int
	vanished bool  // gone, or no longer a directory
	changed  bool  // stat: its mtime or inode moved, or it was dirty
	err      error // the filesystem failed
	// read: its identity and times when read, its blocks (scratch, keys)
	// and its subdirectories' names.
	ino     uint64
	mtime   int64
	dirty   bool
	scratch []scratchEntry
	keys    []byte
	subdirs []string
}

// dirReader is one reader's scratch.
type dirReader struct {
	x      *Index
	nsfd   int
	dirent []byte
	stx    unix.Statx_t
	path   []byte
	rel    []byte
}

// run has readers apply f to the directories todo, and returns the
// results in todo's order. The index is not changed meanwhile.
func (x *Index) run(nsfd int, todo []int, f func(*dirReader, *dirResult)) []dirResult {
	out := make([]dirResult, len(todo))
	for k, i := range todo {
		out[k].i = i
	}
	workers := min(refreshReaders, len(todo))
	if workers <= 1 {
		r := x.reader(nsfd)
		for k := range out {
			f(r, &out[k])
		}
		return out
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &dirReader{x: x, nsfd: nsfd, dirent: make([]byte, direntBufSize)}
			for k := int(next.Add(1) - 1); k < len(out); k = int(next.Add(1) - 1) {
				f(r, &out[k])
			}
		}()
	}
	wg.Wait()
	return out
}

// reader returns the calling goroutine's reader.
func (x *Index) reader(nsfd int) *dirReader {
	if x.own == nil {
		x.own = &dirReader{x: x, dirent: make([]byte, direntBufSize)}
	}
	x.own.nsfd = nsfd
	return x.own
}

// setPath makes r.path rel, NUL-terminated; "." for the namespace
// directory itself.
func (r *dirReader) setPath(rel string) {
	if rel == "" {
		rel = "."
	}
	r.path = append(append(r.path[:0], rel...), 0)
}

// stat says whether directory res.i changed since it was read.
func (r *dirReader) stat(res *dirResult) {
	d := &r.x.dirs[res.i]
	if d.gone {
		return
	}
	r.setPath(d.rel)
	err := statx(r.nsfd, &r.path[0], unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_INO|unix.STATX_MTIME, &r.stx)
	switch {
	case err == unix.ENOENT || err == unix.ENOTDIR || err == nil && r.stx.Mode&unix.S_IFMT != unix.S_IFDIR:
		res.vanished = true
	case err != nil:
		res.err = r.x.pathError("statx", d.rel, err)
	default:
		res.changed = d.dirty || r.stx.Ino != d.ino || statxNanos(r.stx.Mtime) != d.mtime
	}
}

// read reads directory res.i: its blocks and its subdirectories' names.
func (r *dirReader) read(res *dirResult) {
	rel := r.x.dirs[res.i].rel
	r.setPath(rel)
	fd, err := openAt(r.nsfd, &r.path[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
		res.vanished = true
		return
	}
	if err != nil {
		res.err = r.x.pathError("open", rel, err)
		return
	}
	defer unix.Close(fd)
	// The directory's own times before its entries: a change after this
	// point moves its mtime (or falls in the dirty window).
	now := time.Now().UnixNano()
	empty := [1]byte{}
	if err := statx(fd, &empty[0], unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_MTIME, &r.stx); err != nil {
		res.err = r.x.pathError("statx", rel, err)
		return
	}
	res.ino, res.mtime = r.stx.Ino, statxNanos(r.stx.Mtime)
	res.dirty = res.mtime > now-int64(dirtyWindow)
	for {
		n, err := getdents(fd, r.dirent)
		if err != nil {
			res.err = r.x.pathError("getdents", rel, err)
			return
		}
		if n == 0 {
			return
		}
		if res.err = r.parseDirents(fd, rel, r.dirent[:n], res); res.err != nil {
			return
		}
	}
}

// parseDirents handles one getdents buffer of directory fd (rel): regular
// files that are blocks of the layout go to res.scratch, subdirectory
// names to res.subdirs. The layout of struct linux_dirent64 is
// getdents(2)'s.
func (r *dirReader) parseDirents(fd int, rel string, buf []byte, res *dirResult) error {
	x := r.x
	for off := 0; off < len(buf); {
		reclen := int(*(*uint16)(unsafe.Pointer(&buf[off+16])))
		typ := buf[off+18]
		nameStart := off + 19
		off += reclen
		nameEnd := nameStart + bytes.IndexByte(buf[nameStart:off], 0) // NUL-terminated within the record
		name := buf[nameStart:nameEnd]
		if string(name) == "." || string(name) == ".." {
			continue
		}
		switch typ {
		case unix.DT_DIR:
			res.subdirs = append(res.subdirs, string(name))
			continue
		case unix.DT_REG, unix.DT_UNKNOWN:
		default:
			continue // symlinks, devices, sockets: never blocks
		}
		err := statx(fd, &buf[nameStart], unix.AT_SYMLINK_NOFOLLOW,
			unix.STATX_TYPE|unix.STATX_SIZE|unix.STATX_ATIME|unix.STATX_MTIME, &r.stx)
		if err == unix.ENOENT {
			continue // removed since getdents
		}
		if err != nil {
			return x.pathError("statx", joinRel(rel, string(name)), err)
		}
		switch r.stx.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			res.subdirs = append(res.subdirs, string(name))
			continue
		case unix.S_IFREG:
		default:
			continue
		}
		// One string for the layout, which may keep it.
		r.rel = append(r.rel[:0], rel...)
		if rel != "" {
			r.rel = append(r.rel, '/')
		}
		r.rel = append(r.rel, name...)
		key, ok := x.s.layout.KeyFromPath(string(r.rel))
		if !ok {
			continue // a temporary or stray file
		}
		if len(res.keys)+len(key) > math.MaxUint32 {
			return x.pathError("index", rel, unix.EOVERFLOW) // more than 4 GiB of keys in one directory
		}
		start := uint32(len(res.keys))
		res.keys = append(res.keys, key...)
		res.scratch = append(res.scratch, scratchEntry{keyStart: start, keyEnd: uint32(len(res.keys)),
			used: x.recency(&r.stx), size: int64(r.stx.Size)})
	}
	return nil
}

// install makes the blocks that res read directory res.i's, in key
// order, and counts what changed against what it held.
func (x *Index) install(res *dirResult, c *changeCount) {
	i, ino, mtime, dirty := res.i, res.ino, res.mtime, res.dirty
	keyOf := func(e scratchEntry) []byte { return res.keys[e.keyStart:e.keyEnd] }
	slices.SortFunc(res.scratch, func(a, b scratchEntry) int { return bytes.Compare(keyOf(a), keyOf(b)) })
	d := &x.dirs[i]
	keys := make([]byte, len(res.keys))
	entries := make([]indexEntry, len(res.scratch))
	var end uint32
	var blocks, size int64
	for k, e := range res.scratch {
		end += uint32(copy(keys[end:], keyOf(e)))
		entries[k] = indexEntry{keyEnd: end, used: e.used, size: e.size}
		blocks++
		size += e.size
	}
	// Merge the old and new key lists, both sorted, to count additions
	// and removals; forgotten entries are no longer counted anywhere.
	var o, k int
	for o < len(d.entries) || k < len(entries) {
		cmp := 0
		switch {
		case o == len(d.entries):
			cmp = 1
		case k == len(entries):
			cmp = -1
		default:
			cmp = bytes.Compare(d.key(o), entryKey(keys, entries, k))
		}
		switch {
		case cmp < 0:
			if d.entries[o].size != deadSize {
				c.removed++
			}
			o++
		case cmp > 0:
			c.added++
			k++
		default:
			if d.entries[o].size == deadSize {
				c.added++
			}
			o++
			k++
		}
	}
	oldBlocks, oldSize := d.live()
	x.blocks.Add(blocks - oldBlocks)
	x.bytes.Add(size - oldSize)
	d.keys, d.entries, d.ino, d.mtime, d.dirty = keys, entries, ino, mtime, dirty
}

// key returns entry k's key.
func (d *indexDir) key(k int) []byte { return entryKey(d.keys, d.entries, k) }

// entryKey returns entry k's key in keys.
func entryKey(keys []byte, entries []indexEntry, k int) []byte {
	start := uint32(0)
	if k > 0 {
		start = entries[k-1].keyEnd
	}
	return keys[start:entries[k].keyEnd:entries[k].keyEnd]
}

// live returns the blocks and bytes of d's entries not forgotten.
func (d *indexDir) live() (blocks, size int64) {
	for _, e := range d.entries {
		if e.size != deadSize {
			blocks++
			size += e.size
		}
	}
	return blocks, size
}

// find returns the position of key in d, or -1.
func (d *indexDir) find(key []byte) int {
	lo, hi := 0, len(d.entries)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if bytes.Compare(d.key(m), key) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(d.entries) && bytes.Equal(d.key(lo), key) {
		return lo
	}
	return -1
}

// drop empties directory i and marks it gone (except the namespace
// directory's record, which stays, unread), returning how many live blocks
// it held.
func (x *Index) drop(i int) int64 {
	d := &x.dirs[i]
	blocks, size := d.live()
	x.blocks.Add(-blocks)
	x.bytes.Add(-size)
	d.keys, d.entries, d.ino, d.mtime, d.dirty = nil, nil, 0, 0, false
	if i != 0 && !d.gone {
		d.gone = true
		delete(x.byRel, d.rel)
	}
	return blocks
}

// dropTree drops directory i and every directory the index knows beneath
// it, returning how many live blocks they held.
func (x *Index) dropTree(i int) int64 {
	n := x.drop(i)
	prefix := x.dirs[i].rel + "/"
	for k := i + 1; k < len(x.dirs); k++ { // children come after their parents
		if d := &x.dirs[k]; !d.gone && (i == 0 || len(d.rel) > len(prefix) && d.rel[:len(prefix)] == prefix) {
			n += x.drop(k)
		}
	}
	return n
}

// compact removes the records of vanished directories.
func (x *Index) compact() {
	k := 0
	for i := range x.dirs {
		if x.dirs[i].gone {
			continue
		}
		if k != i {
			x.dirs[k] = x.dirs[i]
			x.byRel[x.dirs[k].rel] = int32(k)
		}
		k++
	}
	clear(x.dirs[k:])
	x.dirs = x.dirs[:k]
}

// recency returns max(atime, mtime) of st in seconds since the epoch,
// clamped to int32.
func (x *Index) recency(st *unix.Statx_t) int32 {
	t := max(st.Atime.Sec, st.Mtime.Sec) - x.epoch
	return int32(min(max(t, math.MinInt32), math.MaxInt32))
}

// Victim is a block chosen for eviction.
type Victim struct {
	// Key is the block's key. It is the index's own memory, never written
	// again (a directory read again gets new memory), so it stays valid as
	// long as the caller keeps it; the caller must not modify it.
	Key []byte
	// Size is the block file's size in bytes.
	Size int64
	// Used is when the block was last used as the index knows it:
	// max(atime, mtime), to the second.
	Used time.Time

	// dir and ent are where the block was in the index when chosen; a
	// Refresh may move it, and then RecheckAll and Forget look it up by key.
	dir, ent int32
}

// Victims appends to dst the least recently used blocks, oldest first,
// until their sizes add up to at least need (or every eligible block is
// taken); blocks used after now-minAge are not eligible. Like Evict it
// makes three passes over the entries instead of sorting them — the range
// of eligible recency, a histogram of bytes over 1,024 buckets of it, then
// the choice of the oldest buckets — and sorts only what it appends. So
// LRU holds to the second when the eligible range spans up to 1,024
// seconds, else to 1/1,024 of it: within the newest bucket taken, blocks
// are taken in index order. It allocates nothing beyond growing dst.
func (x *Index) Victims(need int64, minAge time.Duration, now time.Time, dst []Victim) []Victim {
	if need <= 0 {
		return dst
	}
	// Recency is kept to the second, rounded down: used < cutoff means
	// used at least a second before now-minAge, whatever the fraction.
	cutoff := now.Add(-minAge).Unix() - x.epoch
	eligible := func(e indexEntry) bool { return e.size != deadSize && int64(e.used) < cutoff }
	// Pass 1: the range of eligible recency.
	lo, hi, found := int64(math.MaxInt32), int64(math.MinInt32), false
	for i := range x.dirs {
		for _, e := range x.dirs[i].entries {
			if eligible(e) {
				lo, hi, found = min(lo, int64(e.used)), max(hi, int64(e.used)), true
			}
		}
	}
	if !found {
		return dst
	}
	width := (hi - lo + indexBuckets) / indexBuckets // seconds per bucket: ceil((hi-lo+1)/indexBuckets) ≥ 1
	bucket := func(e indexEntry) int { return int((int64(e.used) - lo) / width) }
	// Pass 2: bytes per bucket, to find the newest bucket to take from.
	var hist [indexBuckets]int64
	for i := range x.dirs {
		for _, e := range x.dirs[i].entries {
			if eligible(e) {
				hist[bucket(e)] += e.size
			}
		}
	}
	last, older := indexBuckets, int64(0) // take every bucket below last, and from last until need
	for b, n := range hist {
		if older+n >= need {
			last = b
			break
		}
		older += n
	}
	// Pass 3: every block in the older buckets, then from the last one.
	start, fromLast := len(dst), int64(0)
	for i := range x.dirs {
		d := &x.dirs[i]
		for k, e := range d.entries {
			if !eligible(e) {
				continue
			}
			switch b := bucket(e); {
			case b > last:
				continue
			case b == last:
				if older+fromLast >= need {
					continue
				}
				fromLast += e.size
			}
			dst = append(dst, Victim{Key: d.key(k), Size: e.size, Used: time.Unix(x.epoch+int64(e.used), 0),
				dir: int32(i), ent: int32(k)})
		}
	}
	slices.SortStableFunc(dst[start:], func(a, b Victim) int { return a.Used.Compare(b.Used) })
	return dst
}

// locate returns v's directory and entry in the index, or false if the
// index no longer holds it.
func (x *Index) locate(v *Victim) (*indexDir, int, bool) {
	if i, k := int(v.dir), int(v.ent); i < len(x.dirs) && k < len(x.dirs[i].entries) && bytes.Equal(x.dirs[i].key(k), v.Key) {
		return &x.dirs[i], k, true
	}
	// A Refresh moved it: find its directory by the layout, then the key.
	x.path = x.s.layout.AppendDir(x.path[:0], v.Key)
	i, ok := x.byRel[string(x.path)]
	if !ok {
		return nil, 0, false
	}
	d := &x.dirs[i]
	k := d.find(v.Key)
	if k < 0 {
		return nil, 0, false
	}
	v.dir, v.ent = i, int32(k)
	return d, k, true
}

// judge is the verdict on victim v, given what statx of its file
// returned: gone -> forgets it, false; its recency (max(atime, mtime))
// newer than v.Used (another process used or rewrote it) -> records that
// in the index and in v, false; else true (still a victim). A block the
// index no longer holds is not a victim (false).
func (x *Index) judge(v *Victim, stx *unix.Statx_t, err error) (bool, error) {
	d, k, ok := x.locate(v)
	if !ok || d.entries[k].size == deadSize {
		return false, nil
	}
	if err == unix.ENOENT || err == unix.ENOTDIR || err == nil && stx.Mode&unix.S_IFMT != unix.S_IFREG {
		x.forget(d, k)
		return false, nil
	}
	if err != nil {
		x.path = append(append(x.path[:0], x.nsDir...), '/')
		return false, &fs.PathError{Op: "statx", Path: string(x.s.layout.AppendPath(x.path, v.Key)), Err: err}
	}
	used := x.recency(stx)
	if int64(used) <= v.Used.Unix()-x.epoch {
		return true, nil
	}
	e := &d.entries[k]
	x.bytes.Add(int64(stx.Size) - e.size)
	e.used, e.size = used, int64(stx.Size)
	v.Used, v.Size = time.Unix(x.epoch+int64(used), 0), e.size
	return false, nil
}

// RecheckAll stats the file of every victim in vs and judges it, the statx calls made in
// parallel (refreshReaders at a time: on a network filesystem each is a
// round trip); it returns the victims still to be removed, in vs's order,
// reusing vs's memory, and the first error met (the victims it concerns
// are dropped).
func (x *Index) RecheckAll(vs []Victim) ([]Victim, error) {
	type stat struct {
		stx unix.Statx_t
		err error
	}
	stats := make([]stat, len(vs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(refreshReaders, len(vs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var path []byte
			for k := int(next.Add(1) - 1); k < len(vs); k = int(next.Add(1) - 1) {
				path = append(append(path[:0], x.nsDir...), '/')
				path = append(x.s.layout.AppendPath(path, vs[k].Key), 0)
				stats[k].err = statx(unix.AT_FDCWD, &path[0], unix.AT_SYMLINK_NOFOLLOW,
					unix.STATX_TYPE|unix.STATX_SIZE|unix.STATX_ATIME|unix.STATX_MTIME, &stats[k].stx)
			}
		}()
	}
	wg.Wait()
	kept := vs[:0]
	var first error
	for k := range vs {
		v := vs[k]
		ok, err := x.judge(&v, &stats[k].stx, stats[k].err)
		if err != nil && first == nil {
			first = err
		}
		if ok {
			kept = append(kept, v)
		}
	}
	return kept, first
}

// Forget drops v from the index (the caller deleted it); its bytes leave
// Usage. The entry stays, marked dead, until its directory is read again;
// forgetting a block twice, or one the index no longer holds, does nothing.
func (x *Index) Forget(v Victim) {
	if d, k, ok := x.locate(&v); ok {
		x.forget(d, k)
	}
}

// forget marks entry k of d dead and takes it out of the totals.
func (x *Index) forget(d *indexDir, k int) {
	e := &d.entries[k]
	if e.size == deadSize {
		return
	}
	x.blocks.Add(-1)
	x.bytes.Add(-e.size)
	e.size = deadSize
}

// pathError wraps err with the absolute path of rel.
func (x *Index) pathError(op, rel string, err error) error {
	return &fs.PathError{Op: op, Path: joinRel(x.nsDir, rel), Err: err}
}

// joinRel joins dir and name with '/', or returns name if dir is "".
func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	if name == "" {
		return dir
	}
	return dir + "/" + name
}

// statxNanos returns t in nanoseconds since the Unix epoch.
func statxNanos(t unix.StatxTimestamp) int64 { return t.Sec*1e9 + int64(t.Nsec) }

// statx is statx(2) of the NUL-terminated path relative to dirfd,
// retrying EINTR; it does not allocate.
func statx(dirfd int, path *byte, flags, mask int, stx *unix.Statx_t) error {
	return ignoringEINTR(func() error {
		_, _, e := unix.Syscall6(unix.SYS_STATX, uintptr(dirfd), uintptr(unsafe.Pointer(path)), uintptr(flags),
			uintptr(mask), uintptr(unsafe.Pointer(stx)), 0)
		if e != 0 {
			return e
		}
		return nil
	})
}

// openAt is openat(2) of the NUL-terminated path relative to dirfd, with
// O_CLOEXEC, retrying EINTR.
func openAt(dirfd int, path *byte, flags int) (int, error) {
	for {
		r, _, e := unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(path)), uintptr(flags|unix.O_CLOEXEC), 0, 0, 0)
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		}
		return -1, e
	}
}

// getdents reads directory entries of fd into buf, retrying EINTR.
func getdents(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Getdents(fd, buf)
		if err != unix.EINTR {
			return n, err
		}
	}
}
