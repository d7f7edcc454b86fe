package blockstore

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The protocol tested without a kernel: a fake filesystem answers each
// step, and the tests check the steps laid out, their links, and the
// outcome Judge draws.

// mapDirs is a DirCache for tests.
type mapDirs map[string]bool

func (m mapDirs) Known(dir []byte) bool { return m[string(dir)] }
func (m mapDirs) Remember(dir []byte)   { m[string(dir)] = true }
func (m mapDirs) Forget(dir []byte)     { delete(m, string(dir)) }

// fakeFS answers steps like a healthy filesystem holding one file (the
// block, or what a store wrote), except that fail says what to return
// instead for the n-th step of an op (counting from 0 over all phases).
type fakeFS struct {
	file    []byte // the block file's content, nil if there is none
	tmp     []byte // a store's temporary file
	calls   []StepOp
	fail    map[int]int32
	noMkdir bool   // a MKDIR failed: creating the temporary file fails with ENOENT
	mode    uint16 // what STATX finds at the block's path, if not a regular file
	onFail  func() // called when a step of fail is answered
	// noDirs: directories are missing until a MKDIR makes them; dirLink:
	// a link stands in place of a directory (MKDIR finds it, an open that
	// follows no link fails with ELOOP); dirFile: a file does (ENOTDIR).
	noDirs, dirLink, dirFile bool
	// asyncDIO: a read that starts before the end of the file and ends
	// past the page the file ends in reads what is there and reports all
	// it asked, as Linux 6.18 does for an asynchronous O_DIRECT read of a
	// FUSE file (Config.AsyncDirectReads).
	asyncDIO bool
}

func (f *fakeFS) call(p *Program, s *Step) int32 {
	n := len(f.calls)
	f.calls = append(f.calls, s.Op)
	if r, ok := f.fail[n]; ok {
		if f.onFail != nil {
			f.onFail()
		}
		switch {
		case s.Op == StepMkdir && r < 0 && r != -int32(unix.EEXIST):
			f.noMkdir = true
		case r > 0 && s.Op == StepWrite:
			f.tmp = append(f.tmp[:min(int64(len(f.tmp)), s.Off)], s.Buf[:r]...)
		case r > 0 && s.Op == StepWritev:
			f.tmp = append(f.tmp[:min(int64(len(f.tmp)), s.Off)], vecBytes(s)[:r]...)
		case r > 0 && s.Op == StepRead:
			copy(s.Buf[:r], f.file[s.Off:])
		case r > 0 && s.Op == StepReadv:
			readVec(f.file[:min(int64(len(f.file)), s.Off+int64(r))], s)
		}
		return r
	}
	switch s.Op {
	case StepStatx:
		if f.file == nil {
			return -int32(unix.ENOENT)
		}
		p.Stx.Mode, p.Stx.Size = unix.S_IFREG, uint64(len(f.file))
		if f.mode != 0 {
			p.Stx.Mode = f.mode
		}
	case StepMkdir:
		if f.dirLink || f.dirFile {
			return -int32(unix.EEXIST)
		}
		f.noDirs = false
	case StepOpen:
		// Paths under the directories: a link in place of one fails an
		// open that follows no link, a missing one fails every open.
		switch {
		case (s.How.Flags&unix.O_DIRECTORY != 0 || s.How.Flags&unix.O_CREAT != 0) && f.dirLink:
			return -int32(unix.ELOOP)
		case (s.How.Flags&unix.O_DIRECTORY != 0 || s.How.Flags&unix.O_CREAT != 0) && f.dirFile:
			return -int32(unix.ENOTDIR)
		case (s.How.Flags&unix.O_DIRECTORY != 0 || s.How.Flags&unix.O_CREAT != 0) && f.noDirs:
			return -int32(unix.ENOENT)
		}
		if (s.How.Flags&unix.O_CREAT != 0 || s.role == roleDirCheck) && f.noMkdir {
			return -int32(unix.ENOENT)
		}
		if s.How.Flags&unix.O_CREAT != 0 {
			f.tmp = f.tmp[:0]
		} else if s.role == roleOpen && f.file == nil && s.How.Flags&unix.O_DIRECTORY == 0 {
			return -int32(unix.ENOENT)
		}
	case StepRead:
		if s.Off >= int64(len(f.file)) {
			return 0
		}
		n := int32(copy(s.Buf, f.file[s.Off:]))
		if f.asyncDIO && s.Off+int64(len(s.Buf)) > (int64(len(f.file))+HeaderSize-1)/HeaderSize*HeaderSize {
			return int32(len(s.Buf))
		}
		return n
	case StepReadv:
		n := int32(readVec(f.file, s))
		if want := len(vecBytes(s)); f.asyncDIO && s.Off < int64(len(f.file)) && s.Off+int64(want) > (int64(len(f.file))+HeaderSize-1)/HeaderSize*HeaderSize {
			return int32(want)
		}
		return n
	case StepWrite, StepWritev:
		b := s.Buf
		if s.Op == StepWritev {
			b = vecBytes(s)
		}
		end := s.Off + int64(len(b))
		if int64(len(f.tmp)) < end {
			f.tmp = append(f.tmp, make([]byte, end-int64(len(f.tmp)))...)
		}
		return int32(copy(f.tmp[s.Off:], b))
	case StepRename:
		if s.role == rolePublish {
			f.file = append([]byte(nil), f.tmp...)
		}
	case StepUnlink:
		if s.role == roleRemove || s.role == roleDelete {
			if f.file == nil {
				return -int32(unix.ENOENT)
			}
			f.file = nil
		}
	}
	return 0
}

// vecBytes returns the bytes a vectored write writes, in order.
func vecBytes(s *Step) []byte {
	var b []byte
	for _, v := range s.Vec {
		b = append(b, unsafe.Slice(v.Base, v.Len)...)
	}
	return b
}

// readVec reads file from s.Off into s.Vec's buffers in turn, as preadv
// does, and returns the bytes read.
func readVec(file []byte, s *Step) int {
	n := 0
	for _, v := range s.Vec {
		if s.Off+int64(n) >= int64(len(file)) {
			break
		}
		n += copy(unsafe.Slice(v.Base, v.Len), file[s.Off+int64(n):])
	}
	return n
}

// run executes p against f until it is decided, and returns the phases'
// step lists.
func (f *fakeFS) run(t *testing.T, p *Program) [][]StepOp {
	t.Helper()
	var phases [][]StepOp
	for range 100 {
		var ops []StepOp
		for k := range p.N {
			ops = append(ops, p.Steps[k].Op)
		}
		phases = append(phases, ops)
		require.Equal(t, LinkNone, p.Steps[p.N-1].Link, "a phase's last step ends its chain")
		p.execute(func(s *Step) int32 { return f.call(p, s) })
		if p.Judge() {
			require.False(t, p.fileOpen, "decided with the file open")
			return phases
		}
	}
	t.Fatal("no outcome after 100 phases")
	return nil
}

func testConfig(d Durability) *Config {
	return &Config{Layout: FanoutLayout{}, Durability: d, Dir: "/ns", Quarantine: "/q", Namespace: "ns", Dirs: mapDirs{}}
}

func blockFile(key, payload []byte) []byte {
	f := make([]byte, HeaderSize, HeaderSize+len(payload))
	EncodeHeader(f, key, payload)
	return append(f, payload...)
}

func TestProgramLookup(t *testing.T) {
	key := testKey(1, 32)
	for _, c := range []struct {
		name string
		file []byte
		fail map[int]int32
		mode uint16
		want Status
	}{
		{"found", []byte("x"), nil, unix.S_IFREG, StatusFound},
		{"missing", nil, nil, 0, StatusMissing},
		{"fifo", []byte("x"), nil, unix.S_IFIFO, StatusFound}, // a load judges it
		{"symlink at the path", []byte("x"), nil, unix.S_IFLNK, StatusMissing},
		{"symlink on the way", []byte("x"), map[int]int32{0: -int32(unix.ELOOP)}, 0, StatusMissing},
		{"eio", []byte("x"), map[int]int32{0: -int32(unix.EIO)}, 0, StatusFailed},
		{"stale", []byte("x"), map[int]int32{0: -int32(unix.ESTALE)}, 0, StatusMissing}, // after the kernel's own second walk
	} {
		t.Run(c.name, func(t *testing.T) {
			var p Program
			require.NoError(t, p.Start(testConfig(DurabilityNone), OpLookup, key, nil, nil, false))
			f := &fakeFS{file: c.file, fail: c.fail}
			p.execute(func(s *Step) int32 {
				r := f.call(&p, s)
				if c.mode != 0 {
					p.Stx.Mode = c.mode
				}
				return r
			})
			require.True(t, p.Judge())
			assert.Equal(t, c.want, p.Status, "%v", p.Err)
			if c.want == StatusFailed {
				assert.ErrorIs(t, p.Err, syscall.EIO)
				assert.Contains(t, p.Err.Error(), "statx /ns/")
			}
		})
	}
}

// TestProgramDelete: a delete is one UNLINK of the block's path; a block
// already gone (or stale: replaced or removed by another host) is missing.
func TestProgramDelete(t *testing.T) {
	key := testKey(1, 32)
	for _, c := range []struct {
		name string
		file []byte
		fail map[int]int32
		want Status
	}{
		{"there", []byte("x"), nil, StatusDeleted},
		{"gone", nil, nil, StatusMissing},
		{"stale", []byte("x"), map[int]int32{1: -int32(unix.ESTALE)}, StatusMissing},
		{"read-only", []byte("x"), map[int]int32{1: -int32(unix.EROFS)}, StatusFailed},
		{"unlink-interrupted", []byte("x"), map[int]int32{1: -int32(unix.EINTR), 2: -int32(unix.ECANCELED)}, StatusFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p Program
			require.NoError(t, p.Start(testConfig(DurabilityNone), OpDelete, key, nil, nil, false))
			leaf := p.Steps[0]
			assert.True(t, leaf.Keep && leaf.How.Flags&unix.O_PATH != 0 && leaf.How.Resolve == ResolveBeneath, "%+v", leaf)
			assert.Equal(t, string(FanoutLayout{}.AppendDir(nil, key)), string(cstr(unsafe.Slice(leaf.Path, PathMax))))
			f := &fakeFS{file: c.file, fail: c.fail}
			phases := f.run(t, &p)
			// The block's directory, opened without following a link;
			// the UNLINK beneath it; its close, whatever the UNLINK did.
			want := [][]StepOp{{StepOpen}, {StepUnlink, StepClose}}
			if c.fail[2] != 0 {
				want = append(want, []StepOp{StepClose}) // a close that did not run is done again
			}
			assert.Equal(t, want, phases)
			assert.False(t, p.dirOpen, "the directory is closed")
			assert.Equal(t, c.want, p.Status, "%v", p.Err)
			if c.want == StatusDeleted {
				assert.Nil(t, f.file, "the block is gone")
				path := FanoutLayout{}.AppendPath(nil, key)
				assert.True(t, p.Steps[0].AtDir && p.Steps[1].Keep)
				assert.Equal(t, string(path[bytes.LastIndexByte(path, '/')+1:]), string(cstr(unsafe.Slice(p.Steps[0].Path, 64+5))), "the UNLINK names the file beneath its directory")
			}
			if c.want == StatusFailed {
				assert.Contains(t, p.Err.Error(), "unlinkat /ns/")
			}
		})
	}
	for _, tc := range []struct {
		name  string
		f     *fakeFS
		errno syscall.Errno
		want  Status
	}{
		// A link in place of a directory leads out of the namespace
		// directory: no block of ours there, and nothing is unlinked.
		{"symlinked-directory", &fakeFS{file: []byte("x"), dirLink: true}, syscall.ELOOP, StatusMissing},
		{"directory-gone", &fakeFS{file: []byte("x"), noDirs: true}, syscall.ENOENT, StatusMissing},
		{"file-in-place-of-a-directory", &fakeFS{file: []byte("x"), dirFile: true}, syscall.ENOTDIR, StatusFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Program
			require.NoError(t, p.Start(testConfig(DurabilityNone), OpDelete, key, nil, nil, false))
			phases := tc.f.run(t, &p)
			assert.Equal(t, [][]StepOp{{StepOpen}}, phases, "no UNLINK")
			assert.Equal(t, tc.want, p.Status, "%v", p.Err)
			assert.NotNil(t, tc.f.file)
			if tc.want == StatusFailed {
				assert.ErrorIs(t, p.Err, tc.errno)
			}
		})
	}
}

// TestProgramLookupByOpen: a lookup by O_PATH open is one probe, with no
// close to follow whatever it found; RunSync closes the probe's file.
func TestProgramLookupByOpen(t *testing.T) {
	key := testKey(1, 32)
	cfg := *testConfig(DurabilityNone)
	cfg.LookupByOpen = true
	for _, c := range []struct {
		name string
		res  int32
		want Status
	}{
		{"found", 0, StatusFound},
		{"missing", -int32(unix.ENOENT), StatusMissing},
		{"symlink", -int32(unix.ELOOP), StatusMissing},
		{"eio", -int32(unix.EIO), StatusFailed},
		// Without O_DIRECTORY, a file in place of a directory on the way.
		{"enotdir", -int32(unix.ENOTDIR), StatusFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p Program
			require.NoError(t, p.Start(&cfg, OpLookup, key, nil, nil, false))
			require.Equal(t, 1, p.N)
			require.True(t, p.Steps[0].Probe)
			require.Equal(t, StepOpen, p.Steps[0].Op)
			assert.Equal(t, uint64(unix.O_PATH), p.Steps[0].How.Flags)
			p.Steps[0].Res = c.res
			require.True(t, p.Judge(), "a probe leaves nothing to close")
			assert.Equal(t, c.want, p.Status, "%v", p.Err)
		})
	}

	// Through the kernel: found, and no descriptor left open.
	ns := namespaceWith(t, key)
	before := openFDs(t)
	var p Program
	require.NoError(t, p.Start(&cfg, OpLookup, key, nil, nil, false))
	p.RunSync(ns)
	require.True(t, p.Judge())
	assert.Equal(t, StatusFound, p.Status, "%v", p.Err)
	assert.Equal(t, before, openFDs(t), "the probe's descriptor stayed open")
}

// TestProgramLookupCachedFirst: an O_PATH lookup the dentry cache cannot
// answer (EAGAIN from RESOLVE_CACHED) asks STATX next, judged as any STATX
// lookup; without LookupCachedFirst an EAGAIN is a failure like any other.
func TestProgramLookupCachedFirst(t *testing.T) {
	key := testKey(1, 32)
	cfg := *testConfig(DurabilityNone)
	cfg.LookupByOpen, cfg.LookupCachedFirst = true, true
	for _, c := range []struct {
		name string
		res  int32
		mode uint16
		want Status
	}{
		{"found", 0, unix.S_IFREG, StatusFound},
		{"directory", 0, unix.S_IFDIR, StatusFound},
		{"symlink", 0, unix.S_IFLNK, StatusMissing},
		{"missing", -int32(unix.ENOENT), 0, StatusMissing},
		{"eio", -int32(unix.EIO), 0, StatusFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p Program
			require.NoError(t, p.Start(&cfg, OpLookup, key, nil, nil, false))
			require.Equal(t, 1, p.N)
			require.Equal(t, StepOpen, p.Steps[0].Op)
			assert.Equal(t, uint64(ResolveBeneath|resolveCached), p.Steps[0].How.Resolve)
			assert.False(t, p.Walking(), "before the open's answer")
			p.Steps[0].Res = -int32(unix.EAGAIN)
			require.False(t, p.Judge(), "EAGAIN decided the lookup")
			assert.True(t, p.Walking(), "after EAGAIN")
			require.Equal(t, 1, p.N)
			require.Equal(t, StepStatx, p.Steps[0].Op)
			p.Steps[0].Res, p.Stx.Mode = c.res, c.mode
			require.True(t, p.Judge())
			assert.Equal(t, c.want, p.Status, "%v", p.Err)
			require.NoError(t, p.Start(&cfg, OpLookup, key, nil, nil, false))
			assert.False(t, p.Walking(), "the program started again")
		})
	}
	t.Run("answered from the cache", func(t *testing.T) {
		// The open has O_DIRECTORY: a block there ends it in ENOTDIR.
		for res, want := range map[int32]Status{-int32(unix.ENOTDIR): StatusFound, 0: StatusFound,
			-int32(unix.ENOENT): StatusMissing, -int32(unix.ELOOP): StatusMissing} {
			var p Program
			require.NoError(t, p.Start(&cfg, OpLookup, key, nil, nil, false))
			assert.Equal(t, uint64(unix.O_PATH|unix.O_DIRECTORY), p.Steps[0].How.Flags)
			p.Steps[0].Res = res
			require.True(t, p.Judge())
			assert.Equal(t, want, p.Status, "%d", res)
		}
	})
	t.Run("through the kernel", func(t *testing.T) {
		ns := namespaceWith(t, key)
		for k, want := range map[string]Status{string(key): StatusFound, string(testKey(2, 32)): StatusMissing} {
			var p Program
			require.NoError(t, p.Start(&cfg, OpLookup, []byte(k), nil, nil, false))
			p.RunSync(ns)
			for !p.Judge() {
				p.RunSync(ns)
			}
			assert.Equal(t, want, p.Status, "%v", p.Err)
			if want == StatusFound {
				assert.Equal(t, -int32(unix.ENOTDIR), p.Steps[0].Res, "the open of the block")
			}
		}
	})
	t.Run("without it", func(t *testing.T) {
		cfg.LookupCachedFirst = false
		var p Program
		require.NoError(t, p.Start(&cfg, OpLookup, key, nil, nil, false))
		assert.Equal(t, uint64(ResolveBeneath), p.Steps[0].How.Resolve)
		p.Steps[0].Res = -int32(unix.EAGAIN)
		require.True(t, p.Judge())
		assert.Equal(t, StatusFailed, p.Status)
	})
}

// TestProgramProbe: Probe returns the open Start lays for a cached-first
// lookup, and ProbeVerdict decides from its result exactly what Judge does
// where the open alone decides, and nothing where it does not; through
// the kernel, once the walk is in the dentry cache, its open of a block's
// path ends in ENOTDIR and of a missing one in ENOENT. Without
// LookupCachedFirst or LookupByOpen there is no probe.
func TestProgramProbe(t *testing.T) {
	key := testKey(1, 32)
	cfg := *testConfig(DurabilityNone)
	cfg.LookupByOpen, cfg.LookupCachedFirst = true, true
	var probe, started Program
	path, how, ok := probe.Probe(&cfg, key)
	require.True(t, ok)
	require.NoError(t, started.Start(&cfg, OpLookup, key, nil, nil, false))
	require.Equal(t, 1, started.N)
	s := started.Steps[0]
	assert.Equal(t, unix.BytePtrToString(s.Path), unix.BytePtrToString(path))
	assert.Equal(t, *s.How, *how)
	assert.Equal(t, 1, probe.N, "a cancel's steps")

	// Decided: the verdict, which Judge reaches too. Declined: Judge walks
	// on (EAGAIN), finds a directory there (an open that succeeded), or
	// fails.
	for res, want := range map[int32]Status{
		-int32(unix.ENOTDIR): StatusFound, -int32(unix.ENOENT): StatusMissing,
		-int32(unix.ELOOP): StatusMissing, -int32(unix.ESTALE): StatusMissing,
		-int32(unix.EAGAIN): StatusPending, 0: StatusPending, 5: StatusPending, -int32(unix.EACCES): StatusPending,
		-int32(unix.EIO): StatusPending, -int32(unix.ENAMETOOLONG): StatusPending, -int32(unix.EXDEV): StatusPending,
	} {
		st, ok := ProbeVerdict(res)
		assert.Equal(t, want != StatusPending, ok, "%d", res)
		var p Program
		require.NoError(t, p.Start(&cfg, OpLookup, key, nil, nil, false))
		p.Steps[0].Res = res
		judged := p.Judge()
		switch {
		case ok:
			assert.Equal(t, want, st, "%d", res)
			assert.True(t, judged && p.Status == st, "%d: ProbeVerdict %v, Judge %v %v", res, st, judged, p.Status)
		case res == -int32(unix.EAGAIN):
			assert.True(t, !judged && p.Walking(), "EAGAIN: on to STATX")
		case res >= 0:
			assert.True(t, judged && p.Status == StatusFound, "%d: a directory there", res)
		default:
			assert.True(t, judged && p.Status == StatusFailed, "%d: judged %v", res, p.Status)
		}
	}

	ns := namespaceWith(t, key)
	for k, want := range map[string]int32{string(key): -int32(unix.ENOTDIR), string(testKey(2, 32)): -int32(unix.ENOENT)} {
		var p Program
		path, how, ok := p.Probe(&cfg, []byte(k))
		require.True(t, ok)
		var st unix.Stat_t
		unix.Fstatat(ns, unix.BytePtrToString(path), &st, unix.AT_SYMLINK_NOFOLLOW) // into the dentry cache, there or not
		fd, err := unix.Openat2(ns, unix.BytePtrToString(path), how)
		if err == nil {
			unix.Close(fd)
		}
		assert.Equal(t, unix.Errno(-want), err, "%x", k)
	}

	for _, c := range []struct{ byOpen, cachedFirst bool }{{true, false}, {false, true}, {false, false}} {
		other := cfg
		other.LookupByOpen, other.LookupCachedFirst = c.byOpen, c.cachedFirst
		var p Program
		_, _, ok := p.Probe(&other, key)
		assert.False(t, ok, "%+v", c)
	}

	// A path longer than the program's memory: no probe; Start says why.
	long := cfg
	long.Layout = longLayout{}
	var p Program
	_, _, ok = p.Probe(&long, key)
	assert.False(t, ok, "a path of %d bytes", len(longLayout{}.AppendPath(nil, key)))
	assert.ErrorIs(t, p.Start(&long, OpLookup, key, nil, nil, false), ErrInvalidKey)
}

// longLayout names every block with a path longer than PathMax.
type longLayout struct{ FanoutLayout }

func (l longLayout) AppendPath(dst, key []byte) []byte {
	return l.FanoutLayout.AppendPath(append(dst, strings.Repeat("x", PathMax)...), key)
}

// namespaceWith stores key's block in a new Store and returns its
// namespace directory's descriptor, closed when t ends.
func namespaceWith(t *testing.T, key []byte) int {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, s.Put("ns", key, []byte("payload")))
	ns, err := unix.Open(filepath.Join(dir, "ns"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(ns) })
	return ns
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

func TestProgramLoad(t *testing.T) {
	key := testKey(2, 32)
	payload := testPayload(key, 3*HeaderSize+100)
	good := blockFile(key, payload)
	load := func(t *testing.T, f *fakeFS) (*Program, [][]StepOp) {
		p := new(Program)
		require.NoError(t, p.Start(testConfig(DurabilityNone), OpLoad, key, make([]byte, len(payload)), make([]byte, HeaderSize), false))
		phases := f.run(t, p)
		return p, phases
	}
	t.Run("whole", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepReadv, StepClose}}, phases, "past the end, then header and payload")
		assert.Equal(t, []Link{LinkOnSuccess, LinkAlways, LinkAlways, LinkNone},
			[]Link{p.Steps[0].Link, p.Steps[1].Link, p.Steps[2].Link, p.Steps[3].Link})
	})
	t.Run("missing", func(t *testing.T) {
		p, phases := load(t, &fakeFS{})
		require.Equal(t, StatusMissing, p.Status)
		assert.Len(t, phases, 1)
	})
	// ESTALE: another host replaced or removed the file. The load walks
	// the path again once, closing the stale file first; a second ESTALE
	// is a missing block.
	t.Run("stale-open-retried", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{0: -int32(unix.ESTALE)}})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepReadv, StepClose}, {StepOpen, StepRead, StepReadv, StepClose}}, phases)
	})
	t.Run("stale-read-reopened", func(t *testing.T) {
		// The READV came up short (5 bytes), so the load reads step by
		// step; there the header read meets ESTALE, and with the file
		// left open the load closes it before it walks the path again.
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{2: 5, 6: -int32(unix.ESTALE)}})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepReadv, StepClose}, {StepOpen, StepRead, StepRead, StepRead, StepClose}, {StepClose}, {StepOpen, StepRead, StepRead, StepRead, StepClose}}, phases)
		assert.False(t, p.fileOpen)
	})
	t.Run("stale-readv-reopened", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{2: -int32(unix.ESTALE)}})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepReadv, StepClose}, {StepOpen, StepRead, StepReadv, StepClose}}, phases, "the READV's close ran")
		assert.False(t, p.fileOpen)
	})
	t.Run("removed-by-another-client", func(t *testing.T) {
		// GlusterFS: a read of an open file another client unlinked fails
		// ENOENT; the walk again finds no block.
		f := &fakeFS{file: good, fail: map[int]int32{2: -int32(unix.ENOENT)}}
		f.onFail = func() { f.file = nil }
		p, phases := load(t, f)
		require.Equal(t, StatusMissing, p.Status, "%v", p.Err)
		assert.NoError(t, p.Err)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepReadv, StepClose}, {StepOpen, StepRead, StepReadv, StepClose}}, phases)
	})
	t.Run("stale-twice-missing", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{0: -int32(unix.ESTALE), 1: -int32(unix.ESTALE)}})
		require.Equal(t, StatusMissing, p.Status, "%v", p.Err)
		assert.NoError(t, p.Err)
		assert.Len(t, phases, 2)
	})
	t.Run("short-reads-continue", func(t *testing.T) {
		// The READV returns 5 bytes: the load reads step by step, where
		// the payload read returns 5 bytes: the close is canceled, and the
		// next phase reads the rest.
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{2: 5, 7: 5}})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepReadv, StepClose}, {StepOpen, StepRead, StepRead, StepRead, StepClose}, {StepRead, StepClose}}, phases)
	})
	t.Run("chunks", func(t *testing.T) {
		old := RWMax
		RWMax = 1000
		t.Cleanup(func() { RWMax = old })
		p, phases := load(t, &fakeFS{file: good})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		require.Len(t, phases, 4, "13 reads of at most 1000 bytes, four a phase: %v", phases)
		assert.Equal(t, []StepOp{StepRead, StepClose}, phases[3])
	})
	for _, c := range []struct {
		name, want string
		file       []byte
		quarantine bool
	}{
		{"truncated", "file is 4196 bytes, header says 16484", good[:HeaderSize+100], true},
		{"appended", "file is 16485 bytes, header says 16484", append(append([]byte(nil), good...), 0), true},
		{"short", "shorter than the 4096-byte header", good[:10], true},
		{"empty (a FIFO reads so)", "file is 0 bytes", []byte{}, true},
		{"other size", "payload is 100 bytes, the block size is 12388", blockFile(key, payload[:100]), false},
		// Larger by more than the read past the end: the reads never find
		// its end, and whole as far as they go, it is someone else's.
		{"larger", "payload is 20580 bytes, the block size is 12388", blockFile(key, testPayload(key, len(payload)+2*HeaderSize)), false},
		{"appended past a header", "file is more than 20580 bytes, header says 16484", append(append([]byte(nil), good...), make([]byte, 2*HeaderSize)...), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, phases := load(t, &fakeFS{file: c.file})
			require.Equal(t, StatusCorrupt, p.Status)
			require.ErrorIs(t, p.Err, ErrCorrupt)
			assert.Contains(t, p.Err.Error(), c.want)
			assert.Equal(t, c.quarantine, slices.ContainsFunc(phases, func(ph []StepOp) bool { return slices.Equal(ph, []StepOp{StepRename, StepClose}) }),
				"moved to quarantine: %v", phases)
			if c.quarantine {
				assert.True(t, strings.HasPrefix(string(p.qpath[:]), "/q/ns."))
			}
		})
	}
	t.Run("symlink", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{0: -int32(unix.ELOOP)}})
		require.Equal(t, StatusCorrupt, p.Status)
		assert.ErrorIs(t, p.Err, syscall.ELOOP)
		assert.Len(t, phases, 1, "never quarantined")
	})
	for _, c := range []struct {
		name string
		f    *fakeFS
		want string
	}{
		// A FIFO opened O_NONBLOCK reads as empty.
		{"fifo", &fakeFS{file: []byte{}, mode: unix.S_IFIFO}, "not a regular file (fifo)"},
		// O_DIRECT refuses a directory.
		{"directory", &fakeFS{file: good, mode: unix.S_IFDIR, fail: map[int]int32{0: -int32(unix.EINVAL)}}, "not a regular file (directory)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, phases := load(t, c.f)
			require.Equal(t, StatusCorrupt, p.Status, "%v", p.Err)
			assert.Contains(t, p.Err.Error(), c.want)
			assert.True(t, slices.ContainsFunc(phases, func(ph []StepOp) bool { return slices.Equal(ph, []StepOp{StepStatx}) }), "a STATX looked: %v", phases)
			assert.True(t, slices.ContainsFunc(phases, func(ph []StepOp) bool { return slices.Equal(ph, []StepOp{StepRename, StepClose}) }), "quarantined: %v", phases)
		})
	}
	t.Run("open-einval-on-a-file", func(t *testing.T) {
		// A regular file whose open failed oddly keeps the open's error.
		p, _ := load(t, &fakeFS{file: good, fail: map[int]int32{0: -int32(unix.EINVAL)}})
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.EINVAL)
	})
	t.Run("read-error", func(t *testing.T) {
		p, _ := load(t, &fakeFS{file: good, fail: map[int]int32{2: -int32(unix.EIO)}})
		require.Equal(t, StatusFailed, p.Status)
		var pe *fs.PathError
		require.True(t, errors.As(p.Err, &pe))
		assert.Equal(t, "read", pe.Op)
		assert.ErrorIs(t, p.Err, syscall.EIO)
	})
}

// TestProgramLoadVectored: with ScratchSize of header memory a load reads
// header, payload and past the end with one READV, and with buf's frame
// (the same memory in one piece, around buf) with one READ, hard-linked
// to the close; a read that ends before the payload does loads again step
// by step, so a short read, a truncated file and a FIFO are judged as
// before.
func TestProgramLoadVectored(t *testing.T) {
	for _, framed := range []bool{false, true} {
		t.Run(map[bool]string{false: "scratch", true: "frame"}[framed], func(t *testing.T) { testProgramLoadOneRead(t, framed) })
	}
}

func testProgramLoadOneRead(t *testing.T, framed bool) {
	key := testKey(9, 32)
	payload := testPayload(key, 3*HeaderSize)
	good := blockFile(key, payload)
	byStep := []StepOp{StepOpen, StepRead, StepRead, StepRead, StepClose}
	vectored := []StepOp{StepOpen, StepReadv, StepClose}
	if framed {
		vectored = []StepOp{StepOpen, StepRead, StepClose}
	}
	load := func(t *testing.T, f *fakeFS, format Format) (*Program, [][]StepOp) {
		p := new(Program)
		cfg := testConfig(DurabilityNone)
		cfg.Format = format
		n := len(payload)
		buf, hdr := make([]byte, n), make([]byte, ScratchSize)
		if framed {
			hdr = make([]byte, n+2*HeaderSize)
			buf = hdr[HeaderSize : HeaderSize+n : HeaderSize+n]
		}
		require.NoError(t, p.Start(cfg, OpLoad, key, buf, hdr, false))
		return p, f.run(t, p)
	}
	t.Run("whole", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good}, FormatFramed)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{vectored}, phases)
		assert.Equal(t, []Link{LinkOnSuccess, LinkAlways, LinkNone}, []Link{p.Steps[0].Link, p.Steps[1].Link, p.Steps[2].Link})
		if framed {
			assert.Equal(t, HeaderSize+len(payload)+HeaderSize, len(p.Steps[1].Buf), "header, payload and past the end")
			assert.Same(t, &p.frame[0], &p.Steps[1].Buf[0])
			return
		}
		require.Len(t, p.Steps[1].Vec, 3)
		assert.Equal(t, []uint64{HeaderSize, uint64(len(payload)), HeaderSize}, []uint64{p.Steps[1].Vec[0].Len, p.Steps[1].Vec[1].Len, p.Steps[1].Vec[2].Len})
	})
	t.Run("raw", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: payload}, FormatRaw)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{vectored}, phases)
		if framed {
			assert.Same(t, &p.buf[0], &p.Steps[1].Buf[0], "payload and past the end: no header")
			assert.Equal(t, len(payload)+HeaderSize, len(p.Steps[1].Buf))
			return
		}
		assert.Len(t, p.Steps[1].Vec, 2, "payload and past the end: no header")
	})
	t.Run("appended", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: append(append([]byte(nil), good...), 1, 2)}, FormatFramed)
		require.Equal(t, StatusCorrupt, p.Status)
		assert.Contains(t, p.Err.Error(), "file is 16386 bytes, header says 16384")
		assert.Equal(t, [][]StepOp{vectored, {StepOpen}, {StepRename, StepClose}}, phases, "judged from the one read, then quarantined")
	})
	t.Run("larger", func(t *testing.T) {
		// A block larger by more than the read past the end takes: its end
		// is never found, and it is left where it is.
		p, phases := load(t, &fakeFS{file: blockFile(key, testPayload(key, len(payload)+2*HeaderSize))}, FormatFramed)
		require.Equal(t, StatusCorrupt, p.Status)
		assert.Contains(t, p.Err.Error(), "payload is 20480 bytes, the block size is 12288")
		assert.Equal(t, [][]StepOp{vectored}, phases, "not quarantined")
	})
	t.Run("raw-appended", func(t *testing.T) {
		p, _ := load(t, &fakeFS{file: append(append([]byte(nil), payload...), 1)}, FormatRaw)
		require.Equal(t, StatusCorrupt, p.Status)
		assert.Contains(t, p.Err.Error(), "file is 12289 bytes, the block size is 12288")
	})
	t.Run("short-read-by-step", func(t *testing.T) {
		// The READV returns less than header and payload of a good file:
		// the close ran (hard link), and the load reads again step by step.
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{1: HeaderSize + 5}}, FormatFramed)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{vectored, byStep}, phases)
	})
	t.Run("truncated", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good[:HeaderSize+100]}, FormatFramed)
		require.Equal(t, StatusCorrupt, p.Status)
		assert.Contains(t, p.Err.Error(), "file is 4196 bytes, header says 16384")
		assert.Equal(t, vectored, phases[0])
		assert.Equal(t, byStep, phases[1])
	})
	t.Run("fifo", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: []byte{}, mode: unix.S_IFIFO}, FormatFramed)
		require.Equal(t, StatusCorrupt, p.Status, "%v", p.Err)
		assert.Contains(t, p.Err.Error(), "not a regular file (fifo)")
		assert.True(t, slices.ContainsFunc(phases, func(ph []StepOp) bool { return slices.Equal(ph, []StepOp{StepStatx}) }), "a STATX looked: %v", phases)
	})
	t.Run("stale-read-walks-again", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{1: -int32(unix.ESTALE)}}, FormatFramed)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, [][]StepOp{vectored, vectored}, phases, "the close ran: no close phase")
	})
	t.Run("read-error", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{1: -int32(unix.EIO)}}, FormatFramed)
		require.Equal(t, StatusFailed, p.Status)
		var pe *fs.PathError
		require.True(t, errors.As(p.Err, &pe))
		assert.Equal(t, "read", pe.Op)
		assert.ErrorIs(t, p.Err, syscall.EIO)
		assert.Len(t, phases, 1)
	})
	t.Run("canceled", func(t *testing.T) {
		p, _ := load(t, &fakeFS{file: good, fail: map[int]int32{1: -int32(unix.ECANCELED)}}, FormatFramed)
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.ECANCELED)
	})
	t.Run("bigger-than-one-read", func(t *testing.T) {
		old := RWMax
		RWMax = len(good) // header, payload and past the end do not fit; header and payload do
		t.Cleanup(func() { RWMax = old })
		p, phases := load(t, &fakeFS{file: good}, FormatFramed)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepReadv, StepClose}}, phases)
		RWMax = len(good) - 1
		p, phases = load(t, &fakeFS{file: good}, FormatFramed)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, [][]StepOp{byStep}, phases)
	})
}

// TestProgramStoreFailures fails each step of a store in turn, as the
// filesystem would, and checks that the block is never published, the
// temporary file is removed when it was created, the file is closed, and
// the error names the failed step.
func TestProgramStoreFailures(t *testing.T) {
	key := testKey(3, 32)
	payload := testPayload(key, 2*HeaderSize)
	for _, d := range []Durability{DurabilityNone, DurabilityData, DurabilityFull} {
		// In directories not seen yet, that are there: OPEN tmp, WRITEV,
		// [FSYNC,] CLOSE, RENAME; an error of that OPEN (EIO) is not
		// retried. In new ones, that first OPEN fails (ENOENT) and the
		// second phase makes them: MKDIR, OPEN+CLOSE (the check), MKDIR,
		// OPEN+CLOSE, then the same.
		for _, newDirs := range []bool{false, true} {
			var p Program
			require.NoError(t, p.Start(testConfig(d), OpStore, key, payload, make([]byte, HeaderSize), false))
			skip := 0 // calls before the phase whose steps fail in turn
			if newDirs {
				require.Equal(t, StepOpen, p.Steps[0].Op)
				p.execute(func(*Step) int32 { return -int32(unix.ENOENT) })
				require.False(t, p.Judge())
				require.Equal(t, StepMkdir, p.Steps[0].Op, "the directories are made after a first try did not find them")
				skip = 1
			}
			steps, tmpOpen := p.N, 0
			for k := range steps {
				if p.Steps[k].role == roleOpen {
					tmpOpen = k
				}
			}
			for k := range steps {
				errno := unix.EIO
				if p.Steps[k].Op == StepMkdir {
					errno = unix.EACCES
				}
				name := fmt.Sprintf("%v/new-dirs=%v/%d-%v", d, newDirs, k, p.Steps[k].Op)
				op := p.Steps[k].Op
				t.Run(name, func(t *testing.T) {
					var p Program
					require.NoError(t, p.Start(testConfig(d), OpStore, key, payload, make([]byte, HeaderSize), false))
					f := &fakeFS{noDirs: newDirs, fail: map[int]int32{skip + k: -int32(errno)}}
					phases := f.run(t, &p)
					require.Equal(t, StatusFailed, p.Status)
					assert.True(t, f.file == nil, "a failed store published a block")
					var pe *fs.PathError
					require.True(t, errors.As(p.Err, &pe), "%v", p.Err)
					assert.Equal(t, op.String(), pe.Op)
					assert.ErrorIs(t, p.Err, errno)
					if k <= tmpOpen {
						assert.Len(t, phases, 1+skip, "nothing to clean up")
					} else {
						assert.True(t, slices.ContainsFunc(phases, func(ph []StepOp) bool { return slices.Equal(ph, []StepOp{StepUnlink}) }),
							"the temporary file is removed: %v", phases)
					}
				})
			}
		}
	}
	t.Run("existing-directories-not-made", func(t *testing.T) {
		var p Program
		require.NoError(t, p.Start(testConfig(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
		f := &fakeFS{}
		phases := f.run(t, &p)
		require.Equal(t, StatusStored, p.Status, "%v", p.Err)
		assert.Equal(t, [][]StepOp{{StepOpen, StepWritev, StepClose, StepRename}}, phases)
		assert.True(t, p.cfg.Dirs.Known(p.cfg.Layout.AppendDir(nil, key)), "the directory is remembered")
	})
	t.Run("new-directories-made", func(t *testing.T) {
		var p Program
		require.NoError(t, p.Start(testConfig(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
		f := &fakeFS{noDirs: true}
		phases := f.run(t, &p)
		require.Equal(t, StatusStored, p.Status, "%v", p.Err)
		assert.Equal(t, [][]StepOp{{StepOpen, StepWritev, StepClose, StepRename},
			{StepMkdir, StepOpen, StepClose, StepMkdir, StepOpen, StepClose, StepOpen, StepWritev, StepClose, StepRename}}, phases)
		assert.False(t, p.Renew, "a directory not made yet is no sign of a replaced namespace directory")
	})
	// In a known directory: OPEN WRITEV CLOSE RENAME.
	known := func(d Durability) *Config {
		cfg := testConfig(d)
		cfg.Dirs.Remember(cfg.Layout.AppendDir(nil, key))
		return cfg
	}
	t.Run("close-fails-after-writes", func(t *testing.T) {
		var p Program
		require.NoError(t, p.Start(known(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
		f := &fakeFS{fail: map[int]int32{2: -int32(unix.EIO)}}
		require.Equal(t, StepClose, p.Steps[2].Op)
		phases := f.run(t, &p)
		require.Equal(t, StatusFailed, p.Status)
		assert.Contains(t, p.Err.Error(), "close /ns/")
		assert.True(t, f.file == nil, "published")
		assert.Equal(t, []StepOp{StepUnlink}, phases[1])
	})
	t.Run("rename-fails", func(t *testing.T) {
		var p Program
		require.NoError(t, p.Start(known(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
		f := &fakeFS{fail: map[int]int32{3: -int32(unix.EXDEV)}}
		phases := f.run(t, &p)
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.EXDEV)
		assert.Equal(t, []StepOp{StepUnlink}, phases[1])
	})
	for _, tc := range []struct {
		name  string
		moved int32 // by the WRITEV of header and payload
		rest  []StepOp
	}{
		{"short-write-continues", HeaderSize + 100, []StepOp{StepWrite, StepClose, StepRename}},
		{"short-write-in-the-header", 100, []StepOp{StepWrite, StepWrite, StepClose, StepRename}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Program
			require.NoError(t, p.Start(known(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
			require.Equal(t, StepWritev, p.Steps[1].Op, "header and payload in one write")
			f := &fakeFS{fail: map[int]int32{1: tc.moved}}
			phases := f.run(t, &p)
			require.Equal(t, StatusStored, p.Status, "%v", p.Err)
			assert.True(t, bytes.Equal(blockFile(key, payload), f.file), "the file holds the block")
			assert.Equal(t, tc.rest, phases[1], "the rest written a write each")
		})
	}
	t.Run("short-write-then-enospc", func(t *testing.T) {
		var p Program
		require.NoError(t, p.Start(known(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
		// Calls: OPEN WRITEV(the header and 100 bytes), then WRITE(ENOSPC);
		// the steps a failure cancels make no call.
		f := &fakeFS{fail: map[int]int32{1: HeaderSize + 100, 2: -int32(unix.ENOSPC)}}
		phases := f.run(t, &p)
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.ENOSPC)
		assert.True(t, f.file == nil, "published")
		assert.Equal(t, []StepOp{StepClose}, phases[len(phases)-1], "the file left open by the broken chain is closed")
	})
	t.Run("mkdir-fails-directory-there", func(t *testing.T) {
		// A MKDIR fails (ENOENT: a level was removed and made again
		// meanwhile) yet the check after it finds the directory, so the
		// temporary file is created; a write then fails. The write is the
		// cause, and the temporary file is removed: it once was the
		// MKDIR, retried without removing the file.
		var p Program
		require.NoError(t, p.Start(testConfig(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
		// Calls: OPEN (ENOENT), then MKDIR OPEN CLOSE MKDIR(4) OPEN(5, the
		// check) CLOSE OPEN(7, the temporary file) WRITEV(8).
		f := &fakeFS{noDirs: true, fail: map[int]int32{4: -int32(unix.ENOENT), 5: 0, 7: 0, 8: -int32(unix.ENOSPC)}}
		phases := f.run(t, &p)
		require.Equal(t, StepOpen, f.calls[7])
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.ENOSPC)
		assert.True(t, f.file == nil, "published")
		assert.True(t, slices.ContainsFunc(phases, func(ph []StepOp) bool { return slices.Equal(ph, []StepOp{StepUnlink}) }),
			"the temporary file is removed: %v", phases)
	})
	t.Run("directory-vanished-retries", func(t *testing.T) {
		cfg := testConfig(DurabilityNone)
		cfg.Dirs.Remember(cfg.Layout.AppendDir(nil, key))
		var p Program
		require.NoError(t, p.Start(cfg, OpStore, key, payload, make([]byte, HeaderSize), false))
		f := &fakeFS{fail: map[int]int32{0: -int32(unix.ENOENT)}}
		phases := f.run(t, &p)
		require.Equal(t, StatusStored, p.Status, "%v", p.Err)
		assert.Equal(t, []StepOp{StepMkdir, StepOpen, StepClose, StepMkdir, StepOpen, StepClose, StepOpen, StepWritev, StepClose, StepRename}, phases[1])
		assert.True(t, p.Renew, "the engine is told to look at its namespace directory")
	})
	for _, tc := range []struct {
		name  string
		f     *fakeFS
		errno syscall.Errno
	}{{"symlinked-directory", &fakeFS{dirLink: true}, syscall.ELOOP}, {"file-in-place-of-a-directory", &fakeFS{dirFile: true}, syscall.ENOTDIR}} {
		t.Run(tc.name, func(t *testing.T) {
			// The first try's open, which follows no link, fails; the check
			// of the first level says why: the chain stops before the MKDIR
			// below it and before anything is created.
			var p Program
			require.NoError(t, p.Start(testConfig(DurabilityNone), OpStore, key, payload, make([]byte, HeaderSize), false))
			phases := tc.f.run(t, &p)
			require.Equal(t, StatusFailed, p.Status)
			assert.ErrorIs(t, p.Err, tc.errno)
			assert.Equal(t, []StepOp{StepOpen, StepMkdir, StepOpen}, tc.f.calls, "nothing ran after the check")
			assert.Len(t, phases, 2)
			assert.Contains(t, p.Err.Error(), "openat /ns/"+string(FanoutLayout{}.AppendDir(nil, key)[:2]))
		})
	}
	t.Run("full-durability-syncs-directories", func(t *testing.T) {
		var p Program
		require.NoError(t, p.Start(testConfig(DurabilityFull), OpStore, key, payload, make([]byte, HeaderSize), false))
		phases := (&fakeFS{noDirs: true}).run(t, &p)
		require.Equal(t, StatusStored, p.Status, "%v", p.Err)
		require.Len(t, phases, 3)
		assert.Equal(t, 9, len(phases[2]), "made directories: the block's directory, its parent and the namespace directory")
		// Directories there but not known: another store may have made
		// them and not synced their parents yet; once synced, known.
		cfg := testConfig(DurabilityFull)
		for _, want := range []int{9, 3} {
			p = Program{}
			require.NoError(t, p.Start(cfg, OpStore, key, payload, make([]byte, HeaderSize), false))
			phases = (&fakeFS{}).run(t, &p)
			require.Equal(t, StatusStored, p.Status, "%v", p.Err)
			require.Len(t, phases, 2)
			assert.Equal(t, want, len(phases[1]), "directories there, not known (9) and known (3)")
		}
		// Not known until the syncs succeed: a failed one teaches nothing.
		cfg = testConfig(DurabilityFull)
		p = Program{}
		require.NoError(t, p.Start(cfg, OpStore, key, payload, make([]byte, HeaderSize), false))
		(&fakeFS{fail: map[int]int32{5: -int32(unix.EIO)}}).run(t, &p)
		require.Equal(t, StatusFailed, p.Status)
		require.ErrorIs(t, p.Err, syscall.EIO)
		assert.False(t, cfg.Dirs.Known(FanoutLayout{}.AppendDir(nil, key)))
	})
}

// TestProgramStoreFullSharedNewDir: DurabilityFull, "a block Put returned
// for survives a power loss". Two stores of one Store into one new leaf
// directory: A makes the directories (ab, ab/ab) and, before its rename
// (and so before its directory syncs), B stores into the leaf A made. B's
// first try finds the directories there, not known: B syncs their parents
// too, not only the leaf (it synced only the leaf once).
func TestProgramStoreFullSharedNewDir(t *testing.T) {
	s := openTestStore(t, Options{Durability: DurabilityFull})
	nsDir, err := s.NamespaceDir("ns")
	require.NoError(t, err)
	dirfd, err := unix.Open(nsDir, unix.O_PATH|unix.O_DIRECTORY, 0)
	require.NoError(t, err)
	defer unix.Close(dirfd)
	cfg := s.programConfig("ns")
	keyA := bytes.Repeat([]byte{0xab}, 32)
	keyB := append([]byte(nil), keyA...)
	keyB[31] = 0x01
	hdrA, hdrB := make([]byte, HeaderSize), make([]byte, HeaderSize)
	pa, pb := new(Program), new(Program)
	require.NoError(t, pa.Start(cfg, OpStore, keyA, []byte("A"), hdrA, false))

	var syncedByB []string
	runB := func() {
		require.NoError(t, pb.Start(cfg, OpStore, keyB, []byte("B"), hdrB, false))
		for {
			pb.execute(func(st *Step) int32 {
				if st.Op == StepFsync && st.role == roleDirSync {
					syncedByB = append(syncedByB, string(cstr(pb.dirs[st.dir:])))
				}
				return pb.call(dirfd, st)
			})
			if pb.Judge() {
				return
			}
		}
	}
	ranB := false
	for {
		pa.execute(func(st *Step) int32 {
			if st.role == rolePublish && !ranB {
				ranB = true
				runB()
			}
			return pa.call(dirfd, st)
		})
		if pa.Judge() {
			break
		}
	}
	require.True(t, ranB)
	require.Equal(t, StatusStored, pb.Status, "%v", pb.Err)
	require.Equal(t, StatusStored, pa.Status, "%v", pa.Err)
	assert.Contains(t, syncedByB, "ab", "B returned before the new directory ab/ab's entry in ab was synced; B synced only %q", syncedByB)
	assert.Contains(t, syncedByB, ".", "B returned before the new directory ab's entry in the namespace was synced; B synced only %q", syncedByB)
}

// deepLayout nests blocks ten directories deep: a store's phase would need
// more steps than a program has.
type deepLayout struct{ FanoutLayout }

func (deepLayout) AppendDir(dst, key []byte) []byte {
	return append(dst, "a/b/c/d/e/f/g/h/i/j"...)
}

func TestConfigCheck(t *testing.T) {
	require.NoError(t, testConfig(DurabilityFull).Check())
	cfg := testConfig(DurabilityNone)
	cfg.Layout = deepLayout{}
	err := cfg.Check()
	require.ErrorIs(t, err, ErrInvalidOptions)
	assert.Contains(t, err.Error(), "10 directory levels")
	cfg = testConfig(DurabilityNone)
	cfg.Quarantine = "/" + strings.Repeat("q", 900)
	require.ErrorIs(t, cfg.Check(), ErrInvalidOptions)
}

// TestProgramStoreGuessesDirectories: stores into directories their
// engine has not seen try first without MKDIRs while such directories
// are usually there, and make them first once they are usually missing (a
// new tree), and back again, as Config.Guess learns from their results.
func TestProgramStoreGuessesDirectories(t *testing.T) {
	cfg := testConfig(DurabilityNone)
	cfg.Guess = new(DirGuess)
	payload := []byte("payload")
	// store runs a store of key i in a directory not seen yet, and
	// reports whether its first phase made directories and how many
	// phases it took.
	store := func(i int, there bool) (mkdirFirst bool, phases int) {
		cfg.Dirs = mapDirs{}
		var p Program
		require.NoError(t, p.Start(cfg, OpStore, testKey(i, 32), payload, make([]byte, HeaderSize), false))
		f := &fakeFS{noDirs: !there}
		var ops [][]StepOp
		for range 10 {
			ops = append(ops, stepOps(&p))
			p.execute(func(s *Step) int32 {
				if s.Op == StepMkdir && there {
					f.calls = append(f.calls, s.Op)
					return -int32(unix.EEXIST) // as mkdir(2) answers
				}
				return f.call(&p, s)
			})
			if p.Judge() {
				break
			}
		}
		require.Equal(t, StatusStored, p.Status, "store %d: %v", i, p.Err)
		return slices.Contains(ops[0], StepMkdir), len(ops)
	}

	mk, n := store(0, false)
	assert.False(t, mk, "a fresh guess tries first")
	assert.Equal(t, 2, n, "a first try that finds no directory, then one that makes them")
	for i := 1; i < guessMake; i++ {
		store(i, false)
	}
	mk, n = store(guessMake, false)
	assert.True(t, mk, "after %d first tries that found no directory, a store makes them first", guessMake)
	assert.Equal(t, 1, n)
	for i := guessMake + 1; i < 40; i++ {
		mk, _ = store(i, false)
		require.True(t, mk, "store %d in a new tree", i)
	}

	// The tree is full now (another process made it, say): MKDIRs find
	// every directory there, and stores go back to trying first.
	back := -1
	for i := 40; i < 80 && back < 0; i++ {
		if mk, n := store(i, true); !mk {
			back = i - 40
			assert.Equal(t, 1, n, "a first try that found its directory")
		}
	}
	assert.Equal(t, guessMax-guessMake+1, back, "stores that made directories already there before trying first again")
	mk, _ = store(100, true)
	assert.False(t, mk)
}

// TestProgramStoreSkipsKnownLevels: a store that makes its directories
// remembers each level, and a later one makes and checks only the levels
// not seen yet; a retry after a missing directory forgets them all, as any
// level may have gone.
func TestProgramStoreSkipsKnownLevels(t *testing.T) {
	cfg := testConfig(DurabilityNone)
	cfg.Guess = new(DirGuess)
	cfg.Guess.misses.Store(guessMax) // a new tree: make directories first
	mkdirsOf := func(key []byte) int {
		var p Program
		require.NoError(t, p.Start(cfg, OpStore, key, []byte("payload"), make([]byte, HeaderSize), false))
		phases := (&fakeFS{noDirs: true}).run(t, &p)
		require.Equal(t, StatusStored, p.Status, "%v", p.Err)
		require.Len(t, phases, 1)
		return count(phases[0], StepMkdir)
	}
	other := testKey(0, 32)
	otherDir := FanoutLayout{}.AppendDir(nil, other)
	var key, dir []byte
	for i := 1; key == nil; i++ { // a key in another leaf under the same top level
		if k := testKey(i, 32); k[0] == other[0] && k[1] != other[1] {
			key, dir = k, FanoutLayout{}.AppendDir(nil, k)
		}
	}
	top := dir[:bytes.IndexByte(dir, '/')]
	assert.Equal(t, 2, mkdirsOf(other), "MKDIRs of a store in a tree not seen")
	assert.True(t, cfg.Dirs.Known(otherDir) && cfg.Dirs.Known(top), "both levels remembered")
	assert.Equal(t, 1, mkdirsOf(key), "MKDIRs of a store whose top level was seen")

	// The leaf and its top removed: the store's MKDIR of the leaf fails,
	// and its retry makes both.
	cfg.Dirs.Forget(dir)
	var q Program
	require.NoError(t, q.Start(cfg, OpStore, key, []byte("payload"), make([]byte, HeaderSize), false))
	f := &fakeFS{noDirs: true}
	var mkdirs []int
	for phase := 0; phase < 3; phase++ {
		mkdirs = append(mkdirs, count(stepOps(&q), StepMkdir))
		q.execute(func(s *Step) int32 {
			if s.Op == StepMkdir && phase == 0 {
				return -int32(unix.ENOENT) // its parent is gone
			}
			return f.call(&q, s)
		})
		if q.Judge() {
			break
		}
	}
	require.Equal(t, StatusStored, q.Status, "%v", q.Err)
	assert.Equal(t, []int{1, 2}, mkdirs, "MKDIRs a phase: the leaf alone, then the retry's both levels")
}

func stepOps(p *Program) []StepOp {
	var ops []StepOp
	for k := range p.N {
		ops = append(ops, p.Steps[k].Op)
	}
	return ops
}

func count(ops []StepOp, op StepOp) int {
	n := 0
	for _, o := range ops {
		if o == op {
			n++
		}
	}
	return n
}

// TestProgramSums: only a framed load's read phase through the page cache
// has a checksum for an engine to run aside, and its whole payload.
func TestProgramSums(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	raw := *testConfig(DurabilityNone)
	raw.Format = FormatRaw
	for _, c := range []struct {
		name   string
		cfg    *Config
		op     Op
		direct bool
		want   int
	}{
		{"framed load", testConfig(DurabilityNone), OpLoad, false, 8192},
		{"direct load", testConfig(DurabilityNone), OpLoad, true, 0},
		{"raw load", &raw, OpLoad, false, 0},
		{"store", testConfig(DurabilityNone), OpStore, false, 0},
		{"lookup", testConfig(DurabilityNone), OpLookup, false, 0},
	} {
		var p Program
		buf := make([]byte, 8192)
		if c.op == OpLookup {
			buf = nil
		}
		require.NoError(t, p.Start(c.cfg, c.op, key, buf, make([]byte, ScratchSize), c.direct), c.name)
		assert.Equal(t, c.want, p.Sums(), c.name)
	}
	// A framed load whose block is corrupt: the phases after the verdict
	// (here a quarantine) checksum nothing.
	var p Program
	require.NoError(t, p.Start(testConfig(DurabilityNone), OpLoad, key, make([]byte, 8192), make([]byte, ScratchSize), false))
	for k := range p.N {
		p.Steps[k].Res = int32(p.Steps[k].Asked()) // a block file of zeros: its header is invalid
	}
	require.False(t, p.Judge())
	assert.Zero(t, p.Sums(), "after the verdict")
}

// TestProgramLoadAsyncDirectReads: where an O_DIRECT read past the end of a
// file may report more than the file has (Config.AsyncDirectReads, the
// fakeFS's asyncDIO), a load reads the block's last page apart, and a file
// that ends before that page is judged by the size STATX finds: every file
// shorter than a block is corrupt, with its size said right. Without it,
// the same misreport loads a raw block cut by a page as whole.
func TestProgramLoadAsyncDirectReads(t *testing.T) {
	key := testKey(7, 32)
	payload := testPayload(key, 4*HeaderSize)
	load := func(t *testing.T, f *fakeFS, format Format, async bool) (*Program, [][]StepOp) {
		p := new(Program)
		cfg := testConfig(DurabilityNone)
		cfg.Format, cfg.AsyncDirectReads = format, async
		require.NoError(t, p.Start(cfg, OpLoad, key, make([]byte, len(payload)), make([]byte, HeaderSize), true))
		return p, f.run(t, p)
	}
	for _, format := range []Format{FormatFramed, FormatRaw} {
		good := payload
		reads := []StepOp{StepOpen, StepRead, StepRead, StepRead, StepClose}
		if format == FormatFramed {
			good = blockFile(key, payload)
			reads = []StepOp{StepOpen, StepRead, StepRead, StepReadv, StepClose}
		}
		t.Run(format.String()+"/whole", func(t *testing.T) {
			p, phases := load(t, &fakeFS{file: good, asyncDIO: true}, format, true)
			require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
			assert.Equal(t, payload, p.buf)
			assert.Equal(t, [][]StepOp{reads}, phases, "one read more than without: the last page's")
			assert.Equal(t, int64(len(good)-HeaderSize), p.Steps[2].Off)
		})
		for _, size := range []int{0, HeaderSize, len(good) - 2*HeaderSize, len(good) - HeaderSize - 100, len(good) - HeaderSize, len(good) - 100} {
			t.Run(fmt.Sprintf("%v/size=%d", format, size), func(t *testing.T) {
				p, _ := load(t, &fakeFS{file: good[:size], asyncDIO: true}, format, true)
				require.Equal(t, StatusCorrupt, p.Status)
				assert.Contains(t, p.Err.Error(), fmt.Sprintf("file is %d bytes", size))
			})
		}
		t.Run(format.String()+"/statx-fails", func(t *testing.T) {
			p, phases := load(t, &fakeFS{file: good[:len(good)-2*HeaderSize], asyncDIO: true, fail: map[int]int32{len(reads): -int32(unix.ENOENT)}}, format, true)
			require.Equal(t, [][]StepOp{reads, {StepStatx}}, phases)
			require.Equal(t, StatusCorrupt, p.Status)
			assert.Contains(t, p.Err.Error(), fmt.Sprintf("file is at most %d bytes, a block's is %d", len(good)-HeaderSize, len(good)))
		})
	}
	t.Run("misreport-without", func(t *testing.T) {
		p, _ := load(t, &fakeFS{file: payload[:2*HeaderSize], asyncDIO: true}, FormatRaw, false)
		assert.Equal(t, StatusLoaded, p.Status, "the fake's misreport loads a cut raw block when nothing guards against it")
	})
}

// TestProgramLoadParts: with Config.SumChunk, a page-cache load of a
// bigger framed payload reads it a part a phase, and each Judge folds that
// part into the checksum; the verdict is the whole payload's, whatever
// the parts' reads did.
func TestProgramLoadParts(t *testing.T) {
	key := testKey(2, 32)
	payload := testPayload(key, 3*HeaderSize+100) // 13 parts of at most 1000 bytes
	good := blockFile(key, payload)
	cfg := testConfig(DurabilityNone)
	cfg.SumChunk = 1000
	load := func(t *testing.T, f *fakeFS) (*Program, [][]StepOp) {
		p := new(Program)
		require.NoError(t, p.Start(cfg, OpLoad, key, make([]byte, len(payload)), make([]byte, HeaderSize), false))
		assert.Equal(t, 1000, p.Sums(), "a part a phase")
		return p, f.run(t, p)
	}
	t.Run("whole", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		require.Len(t, phases, 13)
		assert.Equal(t, []StepOp{StepOpen, StepRead, StepRead, StepRead}, phases[0], "past the end, the header, the first part")
		for _, ph := range phases[1:12] {
			assert.Equal(t, []StepOp{StepRead}, ph)
		}
		assert.Equal(t, []StepOp{StepRead, StepClose}, phases[12])
		assert.Equal(t, Checksum(payload), p.sum)
		assert.EqualValues(t, len(payload), p.summed)
	})
	for _, c := range []struct {
		name, want string
		at         int // the byte of the payload flipped
	}{
		{"corrupt first part", "payload checksum", 0},
		{"corrupt last part", "payload checksum", len(payload) - 1},
		{"corrupt middle", "payload checksum", 5500},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := append([]byte(nil), good...)
			file[HeaderSize+c.at] ^= 1
			p, _ := load(t, &fakeFS{file: file})
			require.Equal(t, StatusCorrupt, p.Status)
			require.ErrorIs(t, p.Err, ErrCorrupt)
			assert.Contains(t, p.Err.Error(), c.want)
		})
	}
	for _, c := range []struct {
		name, want string
		file       []byte
	}{
		{"truncated in a part", "file is 6596 bytes, header says 16484", good[:HeaderSize+2500]},
		{"appended", "file is 16485 bytes, header says 16484", append(append([]byte(nil), good...), 0)},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, _ := load(t, &fakeFS{file: c.file})
			require.Equal(t, StatusCorrupt, p.Status)
			require.ErrorIs(t, p.Err, ErrCorrupt)
			assert.Contains(t, p.Err.Error(), c.want)
		})
	}
	t.Run("short-part-reads-on", func(t *testing.T) {
		p, phases := load(t, &fakeFS{file: good, fail: map[int]int32{5: 300}}) // the third part's read
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Len(t, phases, 14)
	})
	t.Run("stale-mid-way-starts-over", func(t *testing.T) {
		// The file read so far was replaced by another host: the load
		// starts again, and its checksum with it.
		other := testPayload(testKey(3, 32), len(payload))
		f := &fakeFS{file: good, fail: map[int]int32{6: -int32(unix.ESTALE)}}
		f.onFail = func() { f.file = blockFile(key, other) }
		p, phases := load(t, f)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, other, p.buf)
		assert.Equal(t, []StepOp{StepClose}, phases[4], "the stale file closed")
		assert.Equal(t, []StepOp{StepOpen, StepRead, StepRead, StepRead}, phases[5])
	})
	t.Run("not for O_DIRECT, raw blocks or one part", func(t *testing.T) {
		var p Program
		require.NoError(t, p.Start(cfg, OpLoad, key, make([]byte, len(payload)), make([]byte, ScratchSize), true))
		assert.False(t, p.sumsParts(), "O_DIRECT")
		raw := *cfg
		raw.Format = FormatRaw
		require.NoError(t, p.Start(&raw, OpLoad, key, make([]byte, len(payload)), make([]byte, ScratchSize), false))
		assert.False(t, p.sumsParts(), "raw")
		require.NoError(t, p.Start(cfg, OpLoad, key, make([]byte, 1000), make([]byte, ScratchSize), false))
		assert.False(t, p.sumsParts(), "one part")
		assert.Equal(t, 1000, p.Sums())
	})
}
