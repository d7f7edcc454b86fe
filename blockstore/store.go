package blockstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Durability says how far Put goes to make a block survive a power loss.
type Durability uint8

const (
	// DurabilityNone renames the block into place without fsync. It is
	// the default and safe for a cache: after a power loss an un-synced
	// block may be missing, truncated or garbage, and the header and
	// payload checksums turn that into a miss (ErrCorrupt), never into
	// wrong data.
	DurabilityNone Durability = iota
	// DurabilityData fsyncs the file before the rename, so a block that is
	// found after a power loss is whole; its name may still be lost.
	DurabilityData
	// DurabilityFull fsyncs the file before the rename and the directory
	// after it (and each fan-out directory's parent when it is created),
	// so a block Put returned for survives a power loss. A directory fsync
	// that fails fails the store, the block already published (whole, and
	// perhaps lost at a power loss).
	DurabilityFull
)

// String returns "none", "data" or "full".
func (d Durability) String() string {
	switch d {
	case DurabilityNone:
		return "none"
	case DurabilityData:
		return "data"
	case DurabilityFull:
		return "full"
	}
	return fmt.Sprintf("Durability(%d)", uint8(d))
}

// Options configures a Store. The zero value is valid.
type Options struct {
	// Durability of Put; DurabilityNone by default.
	Durability Durability
	// Layout of block files under a namespace; FanoutLayout by default.
	Layout Layout
	// Format of block files; FormatFramed by default.
	Format Format
	// BlockSize is every block's payload size in bytes, which a raw block
	// file must have exactly. With FormatRaw, Put stores only blocks of
	// this size and Get and Verify judge files by it, so they need it (0:
	// unknown, and they fail with ErrInvalidOptions; Scan, Clean, Usage
	// and Evict do without). Unused by the framed format, whose header
	// says each block's size.
	BlockSize int64
	// QuarantineDir receives corrupt blocks that Verify quarantines;
	// <root>/~quarantine by default ('~' cannot start a namespace, so it
	// never collides with one). It must be on the root's filesystem.
	QuarantineDir string
}

const (
	fileMode = 0o644
	dirMode  = 0o755
)

// quarantineName is the default quarantine directory under the root.
const quarantineName = "~quarantine"

// Store is a directory of namespaces of block files. Its methods are safe
// for concurrent use by goroutines, and several processes (or hosts
// sharing an NFS export) may open the same root: all coordination is
// through the filesystem (O_EXCL temporary names and rename).
type Store struct {
	root       string     // absolute, cleaned; immutable
	durability Durability // immutable
	layout     Layout     // immutable
	format     Format     // immutable
	blockSize  int64      // immutable; 0 for the framed format
	quarantine string     // absolute; immutable

	// dirsMu guards dirs: the absolute paths of the root, namespace and
	// fan-out directories this Store has created or seen exist. Entries
	// are removed when a directory turns out to have vanished.
	dirsMu sync.RWMutex
	dirs   map[string]struct{}

	configs sync.Map // namespace -> *Config of Put's and Get's programs; built once per namespace

	hooks *testHooks // nil outside tests; set before the Store is shared
}

// testHooks are fault-injection points for this package's tests.
type testHooks struct {
	write        func() error      // before each write of a Put (a pwritev too); an error fails the write
	beforeRename func(tmp string)  // after the temporary file is complete
	beforeRead   func(path string) // before Verify reads a block it has walked to
}

// Open opens the store rooted at root, creating the directory if needed.
func Open(root string, opts Options) (*Store, error) {
	if opts.Durability > DurabilityFull {
		return nil, fmt.Errorf("%w: durability %d", ErrInvalidOptions, opts.Durability)
	}
	if root == "" {
		return nil, fmt.Errorf("%w: empty root", ErrInvalidOptions)
	}
	switch {
	case opts.Format > FormatRaw:
		return nil, fmt.Errorf("%w: format %v", ErrInvalidOptions, opts.Format)
	case opts.Format == FormatRaw && (opts.BlockSize < 0 || opts.BlockSize > PayloadSizeMax):
		return nil, fmt.Errorf("%w: BlockSize %d with the raw format (want 1 to %d, or 0: unknown)", ErrInvalidOptions, opts.BlockSize, PayloadSizeMax)
	case opts.Format == FormatFramed:
		opts.BlockSize = 0
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if err := MkdirAll(abs); err != nil {
		return nil, err
	}
	s := &Store{
		root:       abs,
		durability: opts.Durability,
		layout:     opts.Layout,
		format:     opts.Format,
		blockSize:  opts.BlockSize,
		quarantine: opts.QuarantineDir,
		dirs:       make(map[string]struct{}),
	}
	if s.layout == nil {
		s.layout = FanoutLayout{}
	}
	if err := (&Config{Layout: s.layout, Format: s.format}).Check(); err != nil {
		return nil, err // Put's and Get's programs would not fit their limits
	}
	if s.quarantine == "" {
		s.quarantine = filepath.Join(abs, quarantineName)
	} else if s.quarantine, err = filepath.Abs(s.quarantine); err != nil {
		return nil, err
	}
	return s, nil
}

// Root returns the store's absolute root directory.
func (s *Store) Root() string { return s.root }

// Layout returns the store's layout.
func (s *Store) Layout() Layout { return s.layout }

// Durability returns the store's durability.
func (s *Store) Durability() Durability { return s.durability }

// Format returns the store's block format.
func (s *Store) Format() Format { return s.format }

// needBlockSize fails a call that judges or writes raw blocks when the
// store does not know their size.
func (s *Store) needBlockSize(op string) error {
	if s.format == FormatRaw && s.blockSize == 0 {
		return fmt.Errorf("%w: %s of raw blocks needs Options.BlockSize", ErrInvalidOptions, op)
	}
	return nil
}

// QuarantineDir returns the absolute directory corrupt blocks are moved
// into (Verify, and the tier's loads, with CorruptQuarantine).
func (s *Store) QuarantineDir() string { return s.quarantine }

// NamespaceDir validates ns, creates its directory (and the root) if
// needed and returns its absolute path, for a caller that opens it as a
// dirfd. It does not trust what the Store remembers: a caller that finds
// its dirfd's directory removed calls it to have it created again.
func (s *Store) NamespaceDir(ns string) (string, error) {
	if err := ValidateNamespace(ns); err != nil {
		return "", err
	}
	dir := s.root + "/" + ns
	s.forget(dir)
	if err := s.ensure(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// EnsureDir creates the namespace directory and key's fan-out directories
// if needed. It remembers what exists, so after the first call for a
// directory it takes a read lock and a map lookup and does not allocate.
// If a remembered directory is removed behind the Store's back, EnsureDir
// notices when it has to create a directory inside it, and creates every
// missing level again, the root included. (Put keeps its own account, in
// the same cache, through its store program.)
func (s *Store) EnsureDir(ns string, key []byte) error {
	if err := ValidateNamespace(ns); err != nil {
		return err
	}
	if err := ValidateKey(key); err != nil {
		return err
	}
	bp := pathPool.Get().(*[]byte)
	defer pathPool.Put(bp)
	*bp = s.appendDir((*bp)[:0], ns, key)
	s.dirsMu.RLock()
	_, ok := s.dirs[string(*bp)]
	s.dirsMu.RUnlock()
	if ok {
		return nil
	}
	return s.ensure(string(*bp))
}

// pathPool holds path buffers: a stack array would escape through the
// Layout interface call, costing an allocation per call.
var pathPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// forget drops dir and its ancestors up to the root from what the Store
// remembers: any of them may have gone.
func (s *Store) forget(dir string) {
	s.dirsMu.Lock()
	defer s.dirsMu.Unlock()
	for ; len(dir) >= len(s.root); dir = dir[:strings.LastIndexByte(dir, '/')] {
		delete(s.dirs, dir)
	}
}

// appendDir appends the absolute path of key's directory.
func (s *Store) appendDir(dst []byte, ns string, key []byte) []byte {
	dst = append(dst, s.root...)
	dst = append(dst, '/')
	dst = append(dst, ns...)
	n := len(dst)
	dst = append(dst, '/')
	if d := s.layout.AppendDir(dst, key); len(d) > n+1 {
		return d
	}
	return dst[:n]
}

// ensure creates dir and its missing ancestors from the root down, and
// remembers them. If a remembered directory has gone (creating its child
// fails with ENOENT), it forgets them all and creates every level again,
// the root's own ancestors too.
func (s *Store) ensure(dir string) error {
	err := s.mkdirs(dir)
	if errors.Is(err, fs.ErrNotExist) {
		s.forget(dir)
		if err = MkdirAll(filepath.Dir(s.root)); err == nil {
			err = s.mkdirs(dir)
		}
	}
	return err
}

// mkdirs creates each level of dir from the root down that the Store does
// not remember, and remembers it.
func (s *Store) mkdirs(dir string) error {
	for i := len(s.root); i <= len(dir); i++ {
		if i < len(dir) && dir[i] != '/' {
			continue
		}
		sub := dir[:i]
		s.dirsMu.RLock()
		_, ok := s.dirs[sub]
		s.dirsMu.RUnlock()
		if ok {
			continue
		}
		created, err := s.mkdir(sub)
		if err != nil {
			return &os.PathError{Op: "mkdir", Path: sub, Err: err}
		}
		if created && s.durability == DurabilityFull {
			if err := syncDir(sub[:strings.LastIndexByte(sub, '/')]); err != nil {
				return err
			}
		}
		s.dirsMu.Lock()
		s.dirs[sub] = struct{}{}
		s.dirsMu.Unlock()
	}
	return nil
}

// mkdir makes dir, or finds a directory there, and says whether it made
// it. EEXIST says only that the name is taken: a file there fails here,
// naming it, rather than as a puzzling ENOTDIR of a later create under it.
// A name taken that this client cannot see yet (another GlusterFS client
// just made it; see MkdirAll) is tried again, as MkdirAll does.
func (s *Store) mkdir(dir string) (created bool, err error) {
	for try := 1; ; try++ {
		err = ignoringEINTR(func() error { return unix.Mkdir(dir, dirMode) })
		if err != unix.EEXIST {
			return err == nil, err
		}
		switch e := s.isDir(dir); {
		case e != unix.ENOENT:
			return false, e
		case try == mkdirTries:
			return false, err // EEXIST, and still nothing to see
		}
		time.Sleep(mkdirPause)
	}
}

// isDir returns nil if dir is a directory, ENOTDIR if it is something
// else, or stat's errno. The root and namespace directories are the
// operator's and may be symlinks to a directory; a fan-out directory must
// be a directory itself: a symlink there could lead a store elsewhere.
func (s *Store) isDir(dir string) error {
	stat := unix.Stat
	if len(dir) > len(s.root)+1 && strings.IndexByte(dir[len(s.root)+1:], '/') >= 0 {
		stat = unix.Lstat
	}
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return stat(dir, &st) }); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.ENOTDIR
	}
	return nil
}

// blockPath validates ns and key and returns the block's absolute path.
func (s *Store) blockPath(ns string, key []byte) (string, error) {
	if err := ValidateNamespace(ns); err != nil {
		return "", err
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	bp := pathPool.Get().(*[]byte)
	defer pathPool.Put(bp)
	p := append((*bp)[:0], s.root...)
	p = append(p, '/')
	p = append(p, ns...)
	p = append(p, '/')
	*bp = s.layout.AppendPath(p, key)
	return string(*bp), nil
}

// MkdirAll makes dir and its missing parents, as os.MkdirAll does, for a
// directory that other processes or hosts may be making at the same
// moment. On GlusterFS a mkdir can fail with EEXIST while the directory
// another client just made is not yet visible to this one: os.MkdirAll's
// look after the failure finds nothing, and it fails with "file exists"
// (linux_test.TestEvictionAcrossProcesses/gluster, three processes opening
// one namespace at once). MkdirAll tries again for up to 100 ms, so a name
// that stays taken by something else still fails.
func MkdirAll(dir string) error {
	for try := 1; ; try++ {
		err := os.MkdirAll(dir, dirMode)
		if !errors.Is(err, fs.ErrExist) || try == mkdirTries {
			return err
		}
		time.Sleep(mkdirPause)
	}
}

// How often MkdirAll and Store.mkdir try, and how long they wait between
// tries.
const (
	mkdirTries = 10
	mkdirPause = 10 * time.Millisecond
)
