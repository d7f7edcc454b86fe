package blockstore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Maintenance walks the tree with plain readdir and lstat, never holding
// more than one batch of directory entries per level, so memory stays
// constant however many blocks a namespace holds. The calls are safe to
// run while other goroutines and processes Put, Get and Delete: a block
// that disappears mid-walk is skipped, and a block is only removed if its
// inode is still the one that was examined.

// readDirBatch is how many directory entries are read at a time.
const readDirBatch = 256

// Namespaces returns the namespaces in the store, sorted.
func (s *Store) Namespaces() ([]string, error) {
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && ValidateNamespace(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// namespaces returns []string{ns} after validating it, or every namespace
// if ns is "".
func (s *Store) namespaces(ns string) ([]string, error) {
	if ns == "" {
		return s.Namespaces()
	}
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	return []string{ns}, nil
}

// walk calls fn with the path relative to dir of every regular file under
// dir. It does not follow symlinks, so it cannot loop or leave dir.
func walk(dir, rel string, fn func(rel string) error) error {
	f, err := os.Open(filepath.Join(dir, rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed since its parent was read
	}
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		entries, err := f.ReadDir(readDirBatch)
		for _, e := range entries {
			name := e.Name()
			if rel != "" {
				name = rel + "/" + name
			}
			var werr error
			switch {
			case e.IsDir():
				werr = walk(dir, name, fn)
			case e.Type().IsRegular():
				werr = fn(name)
			}
			if werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Scan calls fn for every block in namespace ns, or in every namespace if
// ns is "", in directory order. Temporary and unrecognised files are
// skipped. It stops at and returns the first error fn returns.
func (s *Store) Scan(ns string, fn func(BlockInfo) error) error {
	nss, err := s.namespaces(ns)
	if err != nil {
		return err
	}
	for _, ns := range nss {
		dir := filepath.Join(s.root, ns)
		err := walk(dir, "", func(rel string) error {
			key, ok := s.layout.KeyFromPath(rel)
			if !ok {
				return nil
			}
			p := dir + "/" + rel
			var st unix.Stat_t
			if err := ignoringEINTR(func() error { return unix.Lstat(p, &st) }); err == unix.ENOENT {
				return nil
			} else if err != nil {
				return &fs.PathError{Op: "lstat", Path: p, Err: err}
			}
			return fn(blockInfo(ns, key, p, &st))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// VerifyAction is what Verify does with a corrupt block.
type VerifyAction uint8

const (
	// VerifyReport only reports corrupt blocks.
	VerifyReport VerifyAction = iota
	// VerifyQuarantine moves corrupt blocks to Options.QuarantineDir,
	// under their namespace, for inspection.
	VerifyQuarantine
	// VerifyRemove deletes corrupt blocks.
	VerifyRemove
)

// Problem is a corrupt block found by Verify.
type Problem struct {
	// Block is the corrupt block.
	Block BlockInfo
	// Err says what was wrong; it wraps ErrCorrupt, or is an EIO.
	Err error
	// Moved is where the block was quarantined, if it was.
	Moved string
	// Removed says whether the block was deleted.
	Removed bool
	// ActionErr is why the action failed, if it did.
	ActionErr error
}

// VerifyStats summarises a Verify run.
type VerifyStats struct {
	// Blocks is how many blocks were checked.
	Blocks int64
	// Bytes is the total size of the files checked.
	Bytes int64
	// Corrupt is how many were corrupt.
	Corrupt int64
}

// Verify reads every block in namespace ns (every namespace if ns is "")
// and checks its header, size, key and payload checksum (a raw block: its
// size). Each corrupt
// block is passed to report (which may be nil) after action has been
// applied to it. An IO error reading a block counts as corruption; any
// other error stops Verify. Its memory is one buffer as large as the
// largest payload.
func (s *Store) Verify(ns string, action VerifyAction, report func(Problem)) (VerifyStats, error) {
	var stats VerifyStats
	if err := s.needBlockSize("Verify"); err != nil {
		return stats, err
	}
	var buf []byte
	grow := func(n int) []byte { buf = make([]byte, n); return buf }
	err := s.Scan(ns, func(b BlockInfo) error {
		if s.hooks != nil && s.hooks.beforeRead != nil {
			s.hooks.beforeRead(b.Path)
		}
		// O_NOATIME: checking a block is not using it, and must not
		// make it look recently used to Evict.
		var ino uint64
		var err error = unix.ENOENT // unless the block's directory is still in the tree
		if aerr := s.atFile(b.Namespace, b.Path, func(dirfd int, name string) error {
			_, ino, err = s.readBlock(dirfd, name, unix.O_NOATIME, b.Key, buf, grow)
			return nil
		}); aerr != nil {
			return &fs.PathError{Op: "verify", Path: b.Path, Err: aerr}
		}
		if err == unix.ENOENT {
			return nil // deleted since the scan saw it, or its directory swapped for a link
		}
		stats.Blocks++
		stats.Bytes += b.Size
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrCorrupt) && err != unix.EIO {
			return &fs.PathError{Op: "verify", Path: b.Path, Err: err}
		}
		stats.Corrupt++
		p := Problem{Block: b, Err: err}
		switch action {
		case VerifyQuarantine:
			p.Moved, p.ActionErr = s.quarantineBlock(b, ino)
		case VerifyRemove:
			p.Removed, p.ActionErr = s.removeIfSame(b, ino)
		}
		if report != nil {
			report(p)
		}
		return nil
	})
	return stats, err
}

// quarantineBlock moves the block file at b.Path, if it is still inode
// ino, into the quarantine directory, and returns where to.
func (s *Store) quarantineBlock(b BlockInfo, ino uint64) (string, error) {
	dir := filepath.Join(s.quarantine, b.Namespace)
	if err := MkdirAll(dir); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, filepath.Base(b.Path)+"."+strconv.FormatInt(time.Now().UnixNano(), 10))
	moved := false
	err := s.atFile(b.Namespace, b.Path, func(dirfd int, name string) error {
		if !sameInode(dirfd, name, ino) {
			return nil // replaced by a fresh Put: nothing to quarantine
		}
		err := ignoringEINTR(func() error { return unix.Renameat(dirfd, name, unix.AT_FDCWD, dst) })
		moved = err == nil
		return err
	})
	if !moved {
		dst = ""
	}
	if err != nil {
		return "", &fs.PathError{Op: "rename", Path: b.Path, Err: err}
	}
	return dst, nil
}

// atFile runs f on the file at path (absolute, beneath namespace ns's
// directory) as its directory's descriptor and its name, the directory
// opened beneath the namespace directory without following a link
// (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS). What maintenance removes
// or moves is then in the tree, whatever was planted in place of a
// directory since the walk saw it. ENOENT, ELOOP and ENOTDIR from that
// open (the file is gone from the tree, or was never in it) are no error:
// f does not run.
func (s *Store) atFile(ns, path string, f func(dirfd int, name string) error) error {
	nsDir := filepath.Join(s.root, ns)
	rel, ok := strings.CutPrefix(path, nsDir+"/")
	if !ok {
		return fmt.Errorf("blockstore: %s is not beneath %s", path, nsDir)
	}
	fd, err := openFile(nsDir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return ignoreGone(err)
	}
	defer unix.Close(fd)
	dir, name := filepath.Split(rel)
	if dir != "" {
		dfd, err := openBeneath(fd, strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return ignoreGone(err)
		}
		defer unix.Close(dfd)
		fd = dfd
	}
	return f(fd, name)
}

// ignoreGone is err, but nil for what says a path is not (or no longer) a
// directory of the tree: ENOENT, ELOOP, ENOTDIR.
func ignoreGone(err error) error {
	if err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR {
		return nil
	}
	return err
}

// openBeneath opens rel beneath dirfd without following any link, with
// O_CLOEXEC, retrying EINTR; before Linux 5.6 (no openat2) it follows
// links but the last component's.
func openBeneath(dirfd int, rel string, flags int) (int, error) {
	for {
		fd := -1
		var err error = unix.ENOSYS
		if !noOpenat2.Load() {
			fd, err = unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: ResolveBeneath})
		}
		if err == unix.ENOSYS {
			noOpenat2.Store(true)
			fd, err = unix.Openat(dirfd, rel, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		}
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// sameInode reports whether name in dirfd is still the file with inode ino.
func sameInode(dirfd int, name string, ino uint64) bool {
	var st unix.Stat_t
	return ignoringEINTR(func() error { return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) }) == nil && st.Ino == ino
}

// removeIfSame unlinks b's file if it is still inode ino. A block replaced
// since it was examined is a fresh Put and is left alone. (Between the
// check and the unlink a Put can still slip in; for a cache that costs a
// miss, not wrong data.)
func (s *Store) removeIfSame(b BlockInfo, ino uint64) (bool, error) {
	removed := false
	err := s.atFile(b.Namespace, b.Path, func(dirfd int, name string) error {
		if !sameInode(dirfd, name, ino) {
			return nil
		}
		err := ignoringEINTR(func() error { return unix.Unlinkat(dirfd, name, 0) })
		removed = err == nil
		if err == unix.ENOENT {
			return nil
		}
		return err
	})
	if err != nil {
		return false, &fs.PathError{Op: "unlink", Path: b.Path, Err: err}
	}
	return removed, nil
}

// CleanStats summarises a Clean run.
type CleanStats struct {
	// Removed is how many temporary files were removed.
	Removed int64
	// Bytes is their total size.
	Bytes int64
}

// Clean removes the temporary files of every namespace that were last
// modified more than olderThan ago: those of writers that crashed or were
// killed between creating and renaming them. olderThan must exceed the
// longest a live Put takes, or Clean removes a file still being written
// (that Put then fails; nothing wrong becomes visible).
func (s *Store) Clean(olderThan time.Duration) (CleanStats, error) {
	var stats CleanStats
	nss, err := s.Namespaces()
	if err != nil {
		return stats, err
	}
	cutoff := time.Now().Add(-olderThan)
	for _, ns := range nss {
		dir := filepath.Join(s.root, ns)
		err := walk(dir, "", func(rel string) error {
			if !s.layout.IsTempPath(rel) {
				return nil
			}
			p := dir + "/" + rel
			err := s.atFile(ns, p, func(dirfd int, name string) error {
				var st unix.Stat_t
				if err := ignoringEINTR(func() error { return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
					return nil // gone already (its writer finished or gave up)
				}
				if st.Mode&unix.S_IFMT != unix.S_IFREG || !time.Unix(st.Mtim.Unix()).Before(cutoff) {
					return nil
				}
				err := ignoringEINTR(func() error { return unix.Unlinkat(dirfd, name, 0) })
				if err == nil {
					stats.Removed++
					stats.Bytes += st.Size
				}
				return ignoreGone(err)
			})
			if err != nil {
				return &fs.PathError{Op: "unlink", Path: p, Err: err}
			}
			return nil
		})
		if err != nil {
			return stats, err
		}
	}
	return stats, nil
}

// NamespaceUsage is the space used by one namespace.
type NamespaceUsage struct {
	// Namespace is the namespace's name.
	Namespace string
	// Blocks is how many blocks it holds.
	Blocks int64
	// Bytes is the total size of its block files, headers included.
	Bytes int64
}

// Usage returns the blocks and bytes of every namespace, sorted by name.
// Temporary files are not counted.
func (s *Store) Usage() ([]NamespaceUsage, error) {
	var out []NamespaceUsage
	err := s.Scan("", func(b BlockInfo) error {
		if len(out) == 0 || out[len(out)-1].Namespace != b.Namespace {
			out = append(out, NamespaceUsage{Namespace: b.Namespace})
		}
		u := &out[len(out)-1]
		u.Blocks++
		u.Bytes += b.Size
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace < out[j].Namespace })
	return out, err
}
