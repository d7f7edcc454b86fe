package faultfs

import (
	"context"
	"path"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is a go-fuse loopback node that consults the FS's rules before each operation it forwards.
// go-fuse calls its methods concurrently, one goroutine per request.
type node struct {
	*fs.LoopbackNode     // does the real work on the backing directory
	fs               *FS // owner; set at creation
}

// The operations below are the ones faults apply to; everything else (symlinks, xattrs, mknod, locks,
// lseek, fallocate, copy_file_range) is passed through by the embedded LoopbackNode untouched.
var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeStatxer        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
	_ fs.NodeReader         = (*node)(nil)
	_ fs.NodeWriter         = (*node)(nil)
	_ fs.NodeWritever       = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeFlusher        = (*node)(nil)
	_ fs.NodeReleaser       = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeStatfser       = (*node)(nil)
)

// WrapChild makes every node the loopback creates (lookup, create, mkdir, …) a faulting node too.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if lb, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: lb, fs: n.fs}
	}
	return ops
}

// relPath returns the node's path relative to the mount root, "." for the root.
func (n *node) relPath() string {
	p := n.Path(n.Root())
	if p == "" {
		return "."
	}
	return p
}

func (n *node) child(name string) string { return path.Join(n.relPath(), name) }

func (n *node) inject(ctx context.Context, kind OpKind, p string) syscall.Errno {
	return n.fs.inject(ctx, Op{Kind: kind, Path: p})
}

// openFlags are the FOPEN_* flags every open file gets.
func (n *node) openFlags() uint32 {
	if n.fs.opts.PageCache {
		return 0
	}
	return fuse.FOPEN_DIRECT_IO
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.inject(ctx, OpLookup, n.child(name)); errno != 0 {
		return nil, errno
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := n.inject(ctx, OpGetattr, n.relPath()); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Getattr(ctx, unwrap(f), out)
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if errno := n.inject(ctx, OpGetattr, n.relPath()); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Statx(ctx, unwrap(f), flags, mask, out)
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := n.inject(ctx, OpSetattr, n.relPath()); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Setattr(ctx, unwrap(f), in, out)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.inject(ctx, OpOpen, n.relPath()); errno != 0 {
		return nil, 0, errno
	}
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return wrap(fh), fuseFlags | n.openFlags(), 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.inject(ctx, OpCreate, n.child(name)); errno != 0 {
		return nil, nil, 0, errno
	}
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, wrap(fh), fuseFlags | n.openFlags(), 0
}

func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.inject(ctx, OpCreate, n.relPath()); errno != 0 {
		return nil, nil, 0, errno
	}
	ch, fh, fuseFlags, errno := n.LoopbackNode.Tmpfile(ctx, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, wrap(fh), fuseFlags | n.openFlags(), 0
}

func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := n.fs.inject(ctx, Op{Kind: OpRead, Path: n.relPath(), Offset: off, Size: len(dest)}); errno != 0 {
		return nil, errno
	}
	r, ok := unwrap(f).(fs.FileReader)
	if !ok {
		return nil, syscall.EBADF
	}
	return r.Read(ctx, dest, off)
}

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := n.fs.inject(ctx, Op{Kind: OpWrite, Path: n.relPath(), Offset: off, Size: len(data)}); errno != 0 {
		return 0, errno
	}
	w, ok := unwrap(f).(fs.FileWriter)
	if !ok {
		return 0, syscall.EBADF
	}
	return w.Write(ctx, data, off)
}

func (n *node) Writev(ctx context.Context, f fs.FileHandle, data [][]byte, off int64) (uint32, syscall.Errno) {
	size := 0
	for _, d := range data {
		size += len(d)
	}
	if errno := n.fs.inject(ctx, Op{Kind: OpWrite, Path: n.relPath(), Offset: off, Size: size}); errno != 0 {
		return 0, errno
	}
	w, ok := unwrap(f).(fs.FileWritever)
	if !ok {
		return 0, syscall.EBADF
	}
	return w.Writev(ctx, data, off)
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if errno := n.inject(ctx, OpFsync, n.relPath()); errno != 0 {
		return errno
	}
	s, ok := unwrap(f).(fs.FileFsyncer)
	if !ok {
		return syscall.EBADF
	}
	return s.Fsync(ctx, flags)
}

func (n *node) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	if errno := n.inject(ctx, OpFlush, n.relPath()); errno != 0 {
		return errno
	}
	s, ok := unwrap(f).(fs.FileFlusher)
	if !ok {
		return 0
	}
	return s.Flush(ctx)
}

// Release closes the backing descriptor even when a fault fails the RELEASE: the kernel forgets the
// file handle whatever we answer, so keeping the descriptor would only leak it.
func (n *node) Release(ctx context.Context, f fs.FileHandle) syscall.Errno {
	errno := n.inject(ctx, OpRelease, n.relPath())
	var rerr syscall.Errno
	if r, ok := unwrap(f).(fs.FileReleaser); ok {
		rerr = r.Release(ctx)
	}
	if errno != 0 {
		return errno
	}
	return rerr
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	newPath := newName
	if np, ok := newParent.(*node); ok {
		newPath = np.child(newName)
	}
	if errno := n.fs.inject(ctx, Op{Kind: OpRename, Path: n.child(name), NewPath: newPath}); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := n.inject(ctx, OpUnlink, n.child(name)); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.inject(ctx, OpMkdir, n.child(name)); errno != 0 {
		return nil, errno
	}
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := n.inject(ctx, OpRmdir, n.child(name)); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.inject(ctx, OpReaddir, n.relPath()); errno != 0 {
		return nil, 0, errno
	}
	return n.LoopbackNode.OpendirHandle(ctx, flags)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.inject(ctx, OpLink, n.child(name)); errno != 0 {
		return nil, errno
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if errno := n.inject(ctx, OpStatfs, n.relPath()); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Statfs(ctx, out)
}

// fileOps is what go-fuse's LoopbackFile does, minus FilePassthroughFder: a file handle offering
// PassthroughFd lets the kernel (as root, Linux ≥ 6.9) send reads and writes straight to the backing file,
// past the server and its faults.
type fileOps interface {
	fs.FileReleaser
	fs.FileGetattrer
	fs.FileStatxer
	fs.FileSetattrer
	fs.FileReader
	fs.FileWriter
	fs.FileWritever
	fs.FileFlusher
	fs.FileFsyncer
	fs.FileLseeker
	fs.FileAllocater
	fs.FileGetlker
	fs.FileSetlker
	fs.FileSetlkwer
	fs.FileIoctler
}

// file hides the passthrough capability of a loopback file; reads, writes, fsync, flush and release
// reach it through node, which injects faults first.
type file struct {
	fileOps // the loopback file; owned by go-fuse until Release
}

func wrap(fh fs.FileHandle) fs.FileHandle {
	if ops, ok := fh.(fileOps); ok {
		return &file{ops}
	}
	return fh
}

func unwrap(fh fs.FileHandle) fs.FileHandle {
	if f, ok := fh.(*file); ok {
		return f.fileOps
	}
	return fh
}
