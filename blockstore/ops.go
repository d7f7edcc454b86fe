package blockstore

import (
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// headerPool holds HeaderSize buffers so Put and Get do not allocate one
// per call.
var headerPool = sync.Pool{New: func() any { return new([HeaderSize]byte) }}

// Put stores payload as the block key in namespace ns, atomically: it
// writes a temporary file in the block's directory, makes it as durable as
// the Store's Durability asks, and renames it onto the block's name.
// Readers see either the old block, no block, or the whole new one.
// Concurrent Puts of the same key are safe: the last rename wins, and
// since blocks are content-addressed its content is the same. On failure
// the temporary file is removed and nothing becomes visible. Put opens the
// namespace directory for the call and works beneath it as PutAt does.
func (s *Store) Put(ns string, key, payload []byte) error {
	return s.put(-1, ns, key, payload)
}

// PutAt is Put for a caller that holds the namespace directory open as
// dirfd (see NamespaceDir). The temporary file is created beneath dirfd
// without following any symlink (OpenBeneath), and renamed relative to it,
// so a symlink planted in place of a fan-out directory cannot make it
// write outside the tree. If dirfd's directory has been removed, PutAt
// creates the directories at the namespace's path again but still fails,
// with an error for which errors.Is(err, fs.ErrNotExist) holds: the caller
// opens the namespace directory again and retries.
func (s *Store) PutAt(dirfd int, ns string, key, payload []byte) error {
	return s.put(dirfd, ns, key, payload)
}

// put is Put (dirfd < 0) and PutAt.
func (s *Store) put(dirfd int, ns string, key, payload []byte) error {
	final, err := s.blockPath(ns, key)
	if err != nil {
		return err
	}
	if len(payload) > PayloadSizeMax {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrPayloadSize, len(payload), PayloadSizeMax)
	}
	if err := s.EnsureDir(ns, key); err != nil {
		return err
	}
	hdr := headerPool.Get().(*[HeaderSize]byte)
	defer headerPool.Put(hdr)
	EncodeHeader(hdr[:], key, payload)

	err = s.publishIn(dirfd, ns, key, final, hdr[:], payload)
	if err == unix.ENOENT {
		// A directory vanished (an admin removed an empty one): the
		// directory cache lied. Recreate and retry once.
		s.ForgetDir(ns, key)
		if err = s.EnsureDir(ns, key); err == nil {
			err = s.publishIn(dirfd, ns, key, final, hdr[:], payload)
		}
	}
	if err != nil {
		return &fs.PathError{Op: "put", Path: final, Err: err}
	}
	return nil
}

// publishIn is publish beneath dirfd, or, if dirfd < 0, beneath the
// namespace directory opened for the call.
func (s *Store) publishIn(dirfd int, ns string, key []byte, final string, hdr, payload []byte) error {
	if dirfd < 0 {
		fd, err := openFile(final[:len(s.root)+1+len(ns)], unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		dirfd = fd
	}
	return s.publish(dirfd, ns, key, final, hdr, payload)
}

// publish writes one temporary file beneath the namespace directory dirfd
// and renames it onto final. It returns raw errnos so that Put can
// recognise ENOENT.
func (s *Store) publish(dirfd int, ns string, key []byte, final string, hdr, payload []byte) error {
	bp := pathPool.Get().(*[]byte)
	defer pathPool.Put(bp)
	dirEnd := len(s.root) + 1 + len(ns) + 1
	rel := final[dirEnd:]
	var fd int
	for attempt := 0; ; attempt++ {
		*bp = append(s.layout.AppendTempPath((*bp)[:0], key, NewTempToken()), 0)
		var err error
		// O_EXCL never follows a symlink at the name itself; OpenBeneath
		// refuses one on the way there.
		fd, err = OpenBeneath(dirfd, *bp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, fileMode)
		if err == nil {
			break
		}
		// EEXIST: another host picked the same pid and token; try
		// another token, a bounded number of times.
		if err != unix.EEXIST || attempt == 3 {
			return err
		}
	}
	tmp := string((*bp)[:len(*bp)-1])
	err := s.writeFile(fd, hdr, payload)
	if cerr := unix.Close(fd); err == nil {
		err = cerr // on NFS, close reports deferred write errors
	}
	if err == nil && s.hooks != nil && s.hooks.beforeRename != nil {
		s.hooks.beforeRename(final[:dirEnd] + tmp)
	}
	if err == nil {
		// The directories were checked by OpenBeneath just now; a link
		// swapped in since then makes the rename fail, not escape, unless
		// its target holds a file of this very temporary name.
		err = ignoringEINTR(func() error { return unix.Renameat(dirfd, tmp, dirfd, rel) })
	}
	if err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0) // best effort; Clean removes what is left
		return err
	}
	if s.durability == DurabilityFull {
		return syncDirAt(dirfd, rel[:max(strings.LastIndexByte(rel, '/'), 0)], final[:strings.LastIndexByte(final, '/')])
	}
	return nil
}

// writeFile writes the header and payload and syncs as Durability asks.
func (s *Store) writeFile(fd int, hdr, payload []byte) error {
	for _, p := range [2][]byte{hdr, payload} {
		if s.hooks != nil && s.hooks.write != nil {
			if err := s.hooks.write(p); err != nil {
				return err
			}
		}
		if err := writeFull(fd, p); err != nil {
			return err
		}
	}
	if s.durability >= DurabilityData {
		// fdatasync suffices: for a new file it also flushes the size,
		// and the other metadata (times) is not needed to read it back.
		return ignoringEINTR(func() error { return unix.Fdatasync(fd) })
	}
	return nil
}

// Get reads the payload of block key in namespace ns into buf and returns
// its length. buf must hold the payload (ErrBufferSize otherwise); for
// fixed-size blocks it is usually exactly as long. A missing block is an
// error for which errors.Is(err, fs.ErrNotExist) holds; a damaged one
// wraps ErrCorrupt, and so does anything but a regular file at the block's
// path, or a symlink on the way there from the namespace directory (which
// Get does not follow). Either way the block is not there.
func (s *Store) Get(ns string, key, buf []byte) (int, error) {
	p, err := s.blockPath(ns, key)
	if err != nil {
		return 0, err
	}
	n, err := s.get(p, len(s.root)+1+len(ns), key, buf)
	if err != nil {
		return 0, &fs.PathError{Op: "get", Path: p, Err: err}
	}
	return n, nil
}

// get reads the block file at path, whose first nsEnd bytes are its
// namespace directory, opening it beneath that directory.
func (s *Store) get(path string, nsEnd int, key, buf []byte) (int, error) {
	dirfd, err := openFile(path[:nsEnd], unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dirfd)
	bp := pathPool.Get().(*[]byte)
	defer pathPool.Put(bp)
	*bp = append(append((*bp)[:0], path[nsEnd+1:]...), 0)
	fd, err := OpenBeneath(dirfd, *bp, blockOpenFlags, 0)
	if err == unix.ELOOP {
		return 0, errSymlink
	}
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	n, _, err := readFile(fd, key, buf, nil)
	return n, err
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

// readBlock reads and verifies the block file at path, opened with flags
// added to blockOpenFlags, into buf: a symlink at path is not followed,
// and is corrupt. If grow is non-nil, buf is replaced by grow(size) when
// it is too small. It returns the payload size, the inode of what is at
// path (once known, also with an error) and raw errnos or
// ErrCorrupt/ErrBufferSize errors.
func readBlock(path string, flags int, key, buf []byte, grow func(int) []byte) (n int, ino uint64, err error) {
	fd, err := openFile(path, blockOpenFlags|flags, 0)
	if err == unix.EPERM && flags&unix.O_NOATIME != 0 {
		// O_NOATIME needs ownership or CAP_FOWNER; without it, read anyway.
		fd, err = openFile(path, blockOpenFlags|flags&^unix.O_NOATIME, 0)
	}
	if err == unix.ELOOP {
		// The link's own inode, so that it, not its target, can be moved.
		var st unix.Stat_t
		if ignoringEINTR(func() error { return unix.Lstat(path, &st) }) == nil {
			ino = st.Ino
		}
		return 0, ino, errSymlink
	}
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	return readFile(fd, key, buf, grow)
}

// readFile is readBlock once the file is open: it checks that the file is
// a regular one before reading.
func readFile(fd int, key, buf []byte, grow func(int) []byte) (n int, ino uint64, err error) {
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return 0, 0, err
	}
	if err := CheckRegular(st.Mode); err != nil {
		return 0, st.Ino, err
	}
	n, err = readOpen(fd, &st, key, buf, grow)
	return n, st.Ino, err
}

// readOpen is readBlock once the file is open.
func readOpen(fd int, st *unix.Stat_t, key, buf []byte, grow func(int) []byte) (int, error) {
	hdr := headerPool.Get().(*[HeaderSize]byte)
	defer headerPool.Put(hdr)
	n, err := preadFull(fd, hdr[:], 0)
	if err != nil {
		return 0, err
	}
	h, err := DecodeHeader(hdr[:n])
	if err != nil {
		return 0, err
	}
	if st.Size != h.FileSize() {
		return 0, h.checkFile(key, nil, st.Size) // fails on the size: not worth reading
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
	if err := h.checkFile(key, buf[:n], st.Size); err != nil {
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
func (s *Store) Delete(ns string, key []byte) error {
	p, err := s.blockPath(ns, key)
	if err != nil {
		return err
	}
	if err := ignoringEINTR(func() error { return unix.Unlink(p) }); err != nil {
		return &fs.PathError{Op: "delete", Path: p, Err: err}
	}
	return nil
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

// writeFull writes all of p, continuing after short writes.
func writeFull(fd int, p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.EIO // write(2) of a non-empty buffer returned 0: no progress possible
		}
		p = p[n:]
	}
	return nil
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

// syncDirAt fsyncs the directory rel beneath dirfd ("" for dirfd itself),
// making its entries durable; name is its path for errors.
func syncDirAt(dirfd int, rel, name string) error {
	if rel == "" {
		rel = "."
	}
	fd, err := OpenBeneath(dirfd, append([]byte(rel), 0), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	if err := ignoringEINTR(func() error { return unix.Fsync(fd) }); err != nil {
		return &os.PathError{Op: "fsync", Path: name, Err: err}
	}
	return nil
}

// noOpenat2 is set once openat2(2) has failed with ENOSYS (Linux < 5.6).
var noOpenat2 atomic.Bool

// OpenBeneath opens path, NUL-terminated and relative to the directory
// dirfd, without leaving that directory and without following any symlink
// on the way: openat2(2) with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, where a
// symlink fails with ELOOP. Without openat2 (Linux before 5.6) it falls
// back to openat(2) with O_NOFOLLOW, which refuses a symlink only as the
// last component. O_CLOEXEC is added and EINTR retried; the error is a raw
// errno. It does not allocate.
func OpenBeneath(dirfd int, path []byte, flags int, mode uint32) (int, error) {
	if len(path) == 0 || path[len(path)-1] != 0 {
		panic("blockstore: OpenBeneath: path is not NUL-terminated")
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	for {
		var fd uintptr
		var errno syscall.Errno
		if noOpenat2.Load() {
			fd, _, errno = unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&path[0])),
				uintptr(flags|unix.O_CLOEXEC|unix.O_NOFOLLOW), uintptr(mode), 0, 0)
		} else {
			fd, _, errno = unix.Syscall6(unix.SYS_OPENAT2, uintptr(dirfd), uintptr(unsafe.Pointer(&path[0])),
				uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
			if errno == unix.ENOSYS {
				noOpenat2.Store(true)
				continue
			}
		}
		switch errno {
		case 0:
			return int(fd), nil
		case unix.EINTR:
			continue
		}
		return -1, errno
	}
}

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
