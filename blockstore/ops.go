package blockstore

import (
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// headerPool holds ScratchSize buffers (a header, and a load's room past
// the block's end) so Put and Get do not allocate one per call.
var headerPool = sync.Pool{New: func() any { return new([ScratchSize]byte) }}

// Put stores payload as the block key in namespace ns, atomically: it
// writes a temporary file in the block's directory, makes it as durable as
// the Store's Durability asks, and renames it onto the block's name.
// Readers see either the old block, no block, or the whole new one.
// Concurrent Puts of the same key are safe: the last rename wins, and
// since blocks are content-addressed its content is the same. On failure
// the temporary file is removed and nothing becomes visible. Put runs the
// store program (Program) beneath the namespace directory, opened for the
// call: nothing on the way is a symlink it follows. In the raw format the
// payload must be the block size, and a block already there is left as
// it is (nil).
func (s *Store) Put(ns string, key, payload []byte) error {
	if err := ValidateNamespace(ns); err != nil {
		return err
	}
	if err := ValidateKey(key); err != nil {
		return err
	}
	if len(payload) > PayloadSizeMax {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrPayloadSize, len(payload), PayloadSizeMax)
	}
	if err := s.needBlockSize("Put"); err != nil {
		return err
	}
	if s.format == FormatRaw && int64(len(payload)) != s.blockSize {
		return fmt.Errorf("%w: %d bytes, the raw format's block size is %d", ErrPayloadSize, len(payload), s.blockSize)
	}
	cfg := s.programConfig(ns)
	dirfd, err := s.openNamespace(cfg.Dir)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dirfd) }()
	hdr := headerPool.Get().(*[ScratchSize]byte)
	defer headerPool.Put(hdr)
	p := programPool.Get().(*Program)
	defer programPool.Put(p)
	if err := p.Start(cfg, OpStore, key, payload, hdr[:HeaderSize], false); err != nil {
		return err
	}
	for {
		p.execute(func(st *Step) int32 { return s.call(p, dirfd, st) })
		if p.Judge() {
			break
		}
		if p.Renew {
			// A directory vanished; if it was the namespace directory,
			// make it again and go on in the new one.
			p.Renew = false
			fd, err := s.openNamespace(cfg.Dir)
			if err != nil {
				return err
			}
			unix.Close(dirfd)
			dirfd = fd
		}
	}
	if p.Status != StatusStored && p.Status != StatusPresent {
		return p.Err
	}
	return nil
}

// programPool holds Programs for Put and Get.
var programPool = sync.Pool{New: func() any { return new(Program) }}

// openNamespace opens the namespace directory nsDir beneath which Put
// works, creating it (again, if it was removed) when it is not there.
func (s *Store) openNamespace(nsDir string) (int, error) {
	fd, err := openFile(nsDir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT {
		s.forget(nsDir)
		if err := s.ensure(nsDir); err != nil {
			return -1, err
		}
		fd, err = openFile(nsDir, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: nsDir, Err: err}
	}
	return fd, nil
}

// call is RunSync's system call with the test hooks in front of it.
func (s *Store) call(p *Program, dirfd int, st *Step) int32 {
	if h := s.hooks; h != nil {
		switch {
		case (st.Op == StepWrite || st.Op == StepWritev) && h.write != nil:
			if err := h.write(); err != nil {
				return -int32(err.(syscall.Errno))
			}
		case st.Op == StepRename && st.role == rolePublish && h.beforeRename != nil:
			h.beforeRename(p.cfg.Dir + "/" + string(cstr(p.tmp[:])))
		}
	}
	return p.call(dirfd, st)
}

// programConfig is the configuration of Put's and Get's programs in
// namespace ns (already valid), made once per namespace.
func (s *Store) programConfig(ns string) *Config {
	if c, ok := s.configs.Load(ns); ok {
		return c.(*Config)
	}
	nsDir := s.root + "/" + ns
	c, _ := s.configs.LoadOrStore(ns, &Config{Layout: s.layout, Format: s.format, Durability: s.durability, Corrupt: CorruptLeave,
		Dir: nsDir, Namespace: ns, Dirs: nsDirs{s, nsDir}})
	return c.(*Config)
}

// DirCache returns the Store's record of which of namespace ns's
// directories exist, as programs use it; safe for concurrent use. Programs
// run elsewhere (the tier's sync engine) share it with Put.
func (s *Store) DirCache(ns string) DirCache { return s.programConfig(ns).Dirs }

// nsDirs is the Store's directory cache as a program's DirCache: the
// programs name directories relative to the namespace directory.
type nsDirs struct {
	s     *Store
	nsDir string
}

func (d nsDirs) abs(bp *[]byte, dir []byte) []byte {
	*bp = append(append(append((*bp)[:0], d.nsDir...), '/'), dir...)
	return *bp
}

func (d nsDirs) Known(dir []byte) bool {
	bp := pathPool.Get().(*[]byte)
	defer pathPool.Put(bp)
	d.s.dirsMu.RLock()
	defer d.s.dirsMu.RUnlock()
	_, ok := d.s.dirs[string(d.abs(bp, dir))]
	return ok
}

func (d nsDirs) Remember(dir []byte) {
	bp := pathPool.Get().(*[]byte)
	defer pathPool.Put(bp)
	d.abs(bp, dir)
	d.s.dirsMu.Lock()
	defer d.s.dirsMu.Unlock()
	if _, ok := d.s.dirs[string(*bp)]; !ok {
		d.s.dirs[string(*bp)] = struct{}{}
	}
}

func (d nsDirs) Forget(dir []byte) {
	bp := pathPool.Get().(*[]byte)
	defer pathPool.Put(bp)
	d.s.forget(string(d.abs(bp, dir)))
}

// Get reads the payload of block key in namespace ns into buf and returns
// its length. buf must hold the payload (ErrBufferSize otherwise); for
// fixed-size blocks it is usually exactly as long. A missing block is an
// error for which errors.Is(err, fs.ErrNotExist) holds; a damaged one
// wraps ErrCorrupt, and so does anything but a regular file at the block's
// path, or a symlink on the way there from the namespace directory (which
// Get does not follow). Either way the block is not there. Get runs the
// load program, as the tier's engines do, and never moves a file.
func (s *Store) Get(ns string, key, buf []byte) (int, error) {
	path, err := s.blockPath(ns, key)
	if err != nil {
		return 0, err
	}
	if err := s.needBlockSize("Get"); err != nil {
		return 0, err
	}
	nsDir := path[:len(s.root)+1+len(ns)]
	dirfd, err := openFile(nsDir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, &fs.PathError{Op: "get", Path: path, Err: err}
	}
	defer unix.Close(dirfd)
	// The program loads a block of one size: take the file's, so that any
	// buffer large enough serves.
	var st unix.Stat_t
	switch err := ignoringEINTR(func() error { return unix.Fstatat(dirfd, path[len(nsDir)+1:], &st, unix.AT_SYMLINK_NOFOLLOW) }); err {
	case nil:
	case unix.ENOENT, unix.ENOTDIR:
		return 0, &fs.PathError{Op: "get", Path: path, Err: unix.ENOENT}
	default:
		return 0, &fs.PathError{Op: "get", Path: path, Err: err}
	}
	size := min(max(st.Size-HeaderSize, 0), int64(len(buf)))
	if s.format == FormatRaw {
		if int64(len(buf)) < s.blockSize {
			return 0, &fs.PathError{Op: "get", Path: path, Err: fmt.Errorf("%w: buffer is %d bytes, the block size is %d", ErrBufferSize, len(buf), s.blockSize)}
		}
		size = s.blockSize
	}
	hdr := headerPool.Get().(*[ScratchSize]byte)
	defer headerPool.Put(hdr)
	p := programPool.Get().(*Program)
	defer programPool.Put(p)
	if err := p.Start(s.programConfig(ns), OpLoad, key, buf[:size], hdr[:], false); err != nil {
		return 0, err
	}
	for {
		p.RunSync(dirfd)
		if p.Judge() {
			break
		}
	}
	switch p.Status {
	case StatusLoaded:
		return int(size), nil
	case StatusMissing:
		return 0, &fs.PathError{Op: "get", Path: path, Err: unix.ENOENT}
	}
	if h, err := DecodeHeader(hdr[:]); s.format == FormatFramed && err == nil && h.PayloadSize > int64(len(buf)) && st.Size == h.FileSize() {
		return 0, &fs.PathError{Op: "get", Path: path, Err: fmt.Errorf("%w: buffer is %d bytes, payload is %d", ErrBufferSize, len(buf), h.PayloadSize)}
	}
	return 0, &fs.PathError{Op: "get", Path: path, Err: p.Err}
}

// blockOpenFlags open a block file for reading without following a
// symlink (ELOOP) or waiting for a FIFO's writer or a device.
const blockOpenFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY

// errSymlink is the error for a symlink where a block file or a directory
// on the way to it should be: followed, it could lead out of the tree.
var errSymlink = fmt.Errorf("%w: symlink at block path", ErrCorrupt)

// CheckRegular returns nil if mode, a stat(2) st_mode, is a regular
// file's, and otherwise an error wrapping ErrCorrupt that names the file
// type: nothing else at a block path is a block.
func CheckRegular(mode uint32) error {
	var kind string
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		kind = "directory"
	case unix.S_IFIFO:
		kind = "fifo"
	case unix.S_IFCHR:
		kind = "character device"
	case unix.S_IFBLK:
		kind = "block device"
	case unix.S_IFSOCK:
		kind = "socket"
	case unix.S_IFLNK:
		kind = "symlink"
	default:
		kind = fmt.Sprintf("mode %#o", mode&unix.S_IFMT)
	}
	return fmt.Errorf("%w: not a regular file (%s)", ErrCorrupt, kind)
}

// readBlock reads and verifies the block file at path in the store's
// format, opened with flags added to blockOpenFlags, into buf: a symlink
// at path is not followed, and is corrupt. If grow is non-nil, buf is
// replaced by grow(size) when it is too small. It returns the payload
// size, the inode of what is at path (once known, also with an error) and
// raw errnos or ErrCorrupt/ErrBufferSize errors.
func (s *Store) readBlock(dirfd int, name string, flags int, key, buf []byte, grow func(int) []byte) (n int, ino uint64, err error) {
	fd, err := openBeneath(dirfd, name, blockOpenFlags|flags)
	if err == unix.EPERM && flags&unix.O_NOATIME != 0 {
		// O_NOATIME needs ownership or CAP_FOWNER; without it, read anyway.
		fd, err = openBeneath(dirfd, name, blockOpenFlags|flags&^unix.O_NOATIME)
	}
	if err == unix.ELOOP {
		// The link's own inode, so that it, not its target, can be moved.
		var st unix.Stat_t
		if ignoringEINTR(func() error { return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) }) == nil {
			ino = st.Ino
		}
		return 0, ino, errSymlink
	}
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	return s.readFile(fd, key, buf, grow)
}

// readFile is readBlock once the file is open: it checks that the file is
// a regular one before reading.
func (s *Store) readFile(fd int, key, buf []byte, grow func(int) []byte) (n int, ino uint64, err error) {
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return 0, 0, err
	}
	if err := CheckRegular(st.Mode); err != nil {
		return 0, st.Ino, err
	}
	if s.format == FormatRaw {
		n, err = s.readRaw(fd, &st, buf, grow)
	} else {
		n, err = readOpen(fd, &st, key, buf, grow)
	}
	return n, st.Ino, err
}

// readRaw is readFile for a raw block: CheckRaw on the file's size, then
// the whole block, whose reads may fail (EIO) or find it shorter.
func (s *Store) readRaw(fd int, st *unix.Stat_t, buf []byte, grow func(int) []byte) (int, error) {
	if err := CheckRaw(st.Size, s.blockSize); err != nil {
		return 0, err
	}
	size := int(s.blockSize)
	if len(buf) < size {
		if grow == nil {
			return 0, fmt.Errorf("%w: buffer is %d bytes, the block size is %d", ErrBufferSize, len(buf), size)
		}
		buf = grow(size)
	}
	n, err := preadFull(fd, buf[:size], 0)
	if err != nil {
		return 0, err
	}
	if err := CheckRaw(int64(n), s.blockSize); err != nil {
		return 0, err // shortened since the fstat
	}
	return n, nil
}

// readOpen is readBlock once the file is open.
func readOpen(fd int, st *unix.Stat_t, key, buf []byte, grow func(int) []byte) (int, error) {
	hdr := headerPool.Get().(*[ScratchSize]byte)
	defer headerPool.Put(hdr)
	n, err := preadFull(fd, hdr[:HeaderSize], 0)
	if err != nil {
		return 0, err
	}
	h, err := DecodeHeader(hdr[:n])
	if err != nil {
		return 0, err
	}
	if st.Size != h.FileSize() {
		return 0, h.checkFile(key, nil, st.Size, nil) // fails on the size: not worth reading
	}
	size := int(h.PayloadSize)
	if len(buf) < size {
		if grow == nil {
			return 0, fmt.Errorf("%w: buffer is %d bytes, payload is %d", ErrBufferSize, len(buf), size)
		}
		buf = grow(size)
	}
	n, err = preadFull(fd, buf[:size], HeaderSize)
	if err != nil {
		return 0, err
	}
	if err := h.checkFile(key, buf[:n], st.Size, nil); err != nil {
		return 0, err
	}
	return n, nil
}

// Has reports whether block key exists in namespace ns, without reading
// or verifying it.
func (s *Store) Has(ns string, key []byte) (bool, error) {
	p, err := s.blockPath(ns, key)
	if err != nil {
		return false, err
	}
	var st unix.Stat_t
	switch err := ignoringEINTR(func() error { return unix.Lstat(p, &st) }); err {
	case nil:
		return true, nil
	case unix.ENOENT:
		return false, nil
	default:
		return false, &fs.PathError{Op: "has", Path: p, Err: err}
	}
}

// Delete removes block key from namespace ns. Deleting a missing block is
// an error for which errors.Is(err, fs.ErrNotExist) holds, as for os.Remove.
// It runs the delete program: the unlink happens beneath the block's
// directory, opened without following a link, so a link planted in place
// of a fan-out directory makes the block missing, not someone else's file
// removed.
func (s *Store) Delete(ns string, key []byte) error {
	path, err := s.blockPath(ns, key)
	if err != nil {
		return err
	}
	cfg := s.programConfig(ns)
	dirfd, err := openFile(cfg.Dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return &fs.PathError{Op: "delete", Path: path, Err: err}
	}
	defer unix.Close(dirfd)
	p := programPool.Get().(*Program)
	defer programPool.Put(p)
	if err := p.Start(cfg, OpDelete, key, nil, nil, false); err != nil {
		return err
	}
	for {
		p.RunSync(dirfd)
		if p.Judge() {
			break
		}
	}
	switch p.Status {
	case StatusDeleted:
		return nil
	case StatusMissing:
		return &fs.PathError{Op: "delete", Path: path, Err: unix.ENOENT}
	}
	return p.Err
}

// BlockInfo describes a block file, from its metadata only.
type BlockInfo struct {
	// Namespace holds the block.
	Namespace string
	// Key is the block's key.
	Key []byte
	// Path is the block file's absolute path.
	Path string
	// Size is the file's size in bytes, header included.
	Size int64
	// ModTime is when the block was written.
	ModTime time.Time
	// AccessTime is when it was last read, as far as the mount records it
	// (never with noatime, at most daily after the first read with relatime).
	AccessTime time.Time
	// ino identifies the file, so maintenance can tell whether a block
	// was replaced between its scan and its removal.
	ino uint64
	// ctime is the inode's change time; rename updates it, so Evict can
	// tell a block published while it ran.
	ctime time.Time
}

// Stat describes block key in namespace ns from its metadata, without
// reading or verifying it. A missing block is an error for which
// errors.Is(err, fs.ErrNotExist) holds.
func (s *Store) Stat(ns string, key []byte) (BlockInfo, error) {
	p, err := s.blockPath(ns, key)
	if err != nil {
		return BlockInfo{}, err
	}
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Lstat(p, &st) }); err != nil {
		return BlockInfo{}, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	return blockInfo(ns, append([]byte(nil), key...), p, &st), nil
}

func blockInfo(ns string, key []byte, path string, st *unix.Stat_t) BlockInfo {
	return BlockInfo{
		Namespace:  ns,
		Key:        key,
		Path:       path,
		Size:       st.Size,
		ModTime:    time.Unix(st.Mtim.Unix()),
		AccessTime: time.Unix(st.Atim.Unix()),
		ino:        st.Ino,
		ctime:      time.Unix(st.Ctim.Unix()),
	}
}

// openFile opens path with O_CLOEXEC added, retrying EINTR.
func openFile(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// preadFull reads into p at off until p is full or the file ends, and
// returns how much it read; the caller compares that against what it needs.
func preadFull(fd int, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pread(fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			break
		}
		done += n
	}
	return done, nil
}

// ignoringEINTR calls fn until it returns something other than EINTR. It
// is the one place EINTR is retried for calls without a result count.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// noOpenat2 is set once openat2(2) has failed with ENOSYS (Linux < 5.6).
var noOpenat2 atomic.Bool

// syncDir fsyncs the directory dir, making its entries durable.
func syncDir(dir string) error {
	fd, err := openFile(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := ignoringEINTR(func() error { return unix.Fsync(fd) }); err != nil {
		return &os.PathError{Op: "fsync", Path: dir, Err: err}
	}
	return nil
}
