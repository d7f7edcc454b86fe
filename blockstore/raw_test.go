package blockstore

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The raw format: the same programs, without a header, judged by size,
// and what a load does with a corrupt file as Config.Corrupt says.

func rawConfig(a CorruptAction) *Config {
	cfg := testConfig(DurabilityNone)
	cfg.Format, cfg.Corrupt = FormatRaw, a
	return cfg
}

func hasPhase(phases [][]StepOp, ph ...StepOp) bool {
	return slices.ContainsFunc(phases, func(p []StepOp) bool { return slices.Equal(p, ph) })
}

func TestProgramRawLoad(t *testing.T) {
	key := testKey(4, 32)
	payload := testPayload(key, 3*HeaderSize)
	load := func(t *testing.T, cfg *Config, f *fakeFS) (*Program, [][]StepOp) {
		p := new(Program)
		require.NoError(t, p.Start(cfg, OpLoad, key, make([]byte, len(payload)), make([]byte, HeaderSize), false))
		return p, f.run(t, p)
	}
	t.Run("whole", func(t *testing.T) {
		p := new(Program)
		require.NoError(t, p.Start(rawConfig(CorruptDefault), OpLoad, key, make([]byte, len(payload)), make([]byte, HeaderSize), false))
		require.Equal(t, 4, p.N, "OPEN, READ past the end, READ the payload, CLOSE: no header")
		assert.Equal(t, int64(len(payload)), p.Steps[1].Off, "the read past the end starts where the block ends")
		assert.Equal(t, int64(0), p.Steps[2].Off, "the payload starts the file")
		phases := (&fakeFS{file: payload}).run(t, p)
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Equal(t, [][]StepOp{{StepOpen, StepRead, StepRead, StepClose}}, phases)
	})
	t.Run("chunks", func(t *testing.T) {
		old := RWMax
		RWMax = 1000
		t.Cleanup(func() { RWMax = old })
		p, phases := load(t, rawConfig(CorruptDefault), &fakeFS{file: payload})
		require.Equal(t, StatusLoaded, p.Status, "%v", p.Err)
		assert.Equal(t, payload, p.buf)
		assert.Len(t, phases, 4, "13 reads of at most 1000 bytes, four a phase: %v", phases)
	})
	framed := blockFile(key, payload)
	cases := []struct {
		name, want string
		f          func() *fakeFS
	}{
		{"truncated", "file is 100 bytes, the block size is 12288", func() *fakeFS { return &fakeFS{file: payload[:100]} }},
		{"extended", "file is 12289 bytes, the block size is 12288", func() *fakeFS { return &fakeFS{file: append(slices.Clone(payload), 0)} }},
		{"zero-length", "file is 0 bytes, the block size is 12288", func() *fakeFS { return &fakeFS{file: []byte{}} }},
		{"framed block", "file is 16384 bytes, the block size is 12288", func() *fakeFS { return &fakeFS{file: framed} }},
		// Open succeeds on a directory (without O_DIRECT); its reads fail.
		{"directory", "not a regular file (directory)", func() *fakeFS {
			return &fakeFS{file: []byte{}, mode: unix.S_IFDIR, fail: map[int]int32{1: -int32(unix.EISDIR), 2: -int32(unix.EISDIR)}}
		}},
		{"fifo", "not a regular file (fifo)", func() *fakeFS { return &fakeFS{file: []byte{}, mode: unix.S_IFIFO} }},
	}
	for _, c := range cases {
		for _, a := range []CorruptAction{CorruptDefault, CorruptLeave, CorruptRemove, CorruptQuarantine} {
			t.Run(c.name+"/"+a.String(), func(t *testing.T) {
				f := c.f()
				before := slices.Clone(f.file)
				p, phases := load(t, rawConfig(a), f)
				require.Equal(t, StatusCorrupt, p.Status, "%v", p.Err)
				require.ErrorIs(t, p.Err, ErrCorrupt)
				assert.Contains(t, p.Err.Error(), c.want)
				d, disposed := p.Disposed()
				switch a {
				case CorruptDefault, CorruptLeave:
					assert.False(t, disposed, "raw blocks are left in place by default")
					assert.False(t, hasPhase(phases, StepUnlink, StepClose) || hasPhase(phases, StepRename, StepClose), "%v", phases)
					assert.Equal(t, before, f.file, "the file was changed")
				case CorruptRemove:
					require.True(t, disposed)
					assert.Equal(t, CorruptRemove, d.Action)
					assert.NoError(t, d.Err)
					assert.Equal(t, string(p.cfg.Layout.AppendPath(nil, key)), string(d.Rel))
					assert.True(t, hasPhase(phases, StepUnlink, StepClose), "%v", phases)
					assert.Nil(t, f.file, "the file is still there")
				case CorruptQuarantine:
					require.True(t, disposed)
					assert.Equal(t, CorruptQuarantine, d.Action)
					assert.Contains(t, string(d.Dst), "/q/ns.")
					assert.True(t, hasPhase(phases, StepRename, StepClose), "%v", phases)
				}
			})
		}
	}
	t.Run("symlink", func(t *testing.T) {
		p, phases := load(t, rawConfig(CorruptRemove), &fakeFS{file: payload, fail: map[int]int32{0: -int32(unix.ELOOP)}})
		require.Equal(t, StatusCorrupt, p.Status)
		assert.ErrorIs(t, p.Err, syscall.ELOOP)
		assert.Len(t, phases, 1, "a link is never removed or followed")
	})
	t.Run("remove-fails", func(t *testing.T) {
		p, _ := load(t, rawConfig(CorruptRemove), &fakeFS{file: payload[:5], mode: unix.S_IFREG, fail: map[int]int32{5: -int32(unix.EACCES)}})
		require.Equal(t, StatusCorrupt, p.Status)
		d, ok := p.Disposed()
		require.True(t, ok)
		assert.ErrorIs(t, d.Err, syscall.EACCES)
	})
}

func TestProgramRawStore(t *testing.T) {
	key := testKey(5, 32)
	payload := testPayload(key, 2*HeaderSize)
	store := func(t *testing.T, f *fakeFS, direct bool) (*Program, [][]StepOp) {
		p := new(Program)
		require.NoError(t, p.Start(rawConfig(CorruptDefault), OpStore, key, payload, make([]byte, HeaderSize), direct))
		return p, f.run(t, p)
	}
	t.Run("new", func(t *testing.T) {
		f := &fakeFS{noDirs: true}
		p, phases := store(t, f, false)
		require.Equal(t, StatusStored, p.Status, "%v", p.Err)
		assert.Equal(t, payload, f.file, "the file is the payload and nothing else")
		assert.Equal(t, [][]StepOp{{StepOpen, StepClose, StepStatx},
			{StepMkdir, StepOpen, StepClose, StepMkdir, StepOpen, StepClose, StepOpen, StepWrite, StepClose, StepRename}}, phases)
		assert.Equal(t, uint64(unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC), p.How.Flags, "vLLM's temporary file flags")
	})
	t.Run("known directory", func(t *testing.T) {
		f := &fakeFS{}
		cfg := rawConfig(CorruptDefault)
		p := new(Program)
		require.NoError(t, p.Start(cfg, OpStore, key, payload, make([]byte, HeaderSize), false))
		assert.Equal(t, [][]StepOp{{StepOpen, StepClose, StepStatx}, {StepOpen, StepWrite, StepClose, StepRename}}, f.run(t, p),
			"the directory's open makes it known: the store makes no directory")
		f.file = nil
		require.NoError(t, p.Start(cfg, OpStore, key, payload, make([]byte, HeaderSize), false))
		assert.Equal(t, [][]StepOp{{StepStatx}, {StepOpen, StepWrite, StepClose, StepRename}}, f.run(t, p),
			"a known directory is not opened again")
	})
	t.Run("link in place of a directory", func(t *testing.T) {
		// Another tree's file of the right size behind the link: the store
		// must not take it for its block.
		f := &fakeFS{file: slices.Clone(payload), dirLink: true}
		p, phases := store(t, f, false)
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.ELOOP)
		assert.Equal(t, []StepOp{StepOpen, StepClose, StepStatx}, phases[0])
		assert.Len(t, phases, 2, "the store's directory steps fail at the link")
		assert.Nil(t, f.tmp, "nothing written")
	})
	t.Run("direct", func(t *testing.T) {
		f := &fakeFS{}
		p, _ := store(t, f, true)
		require.Equal(t, StatusStored, p.Status, "%v", p.Err)
		assert.NotZero(t, p.How.Flags&unix.O_DIRECT)
	})
	t.Run("present", func(t *testing.T) {
		f := &fakeFS{file: slices.Clone(payload)}
		p, phases := store(t, f, false)
		require.Equal(t, StatusPresent, p.Status, "%v", p.Err)
		assert.Equal(t, [][]StepOp{{StepOpen, StepClose, StepStatx}}, phases, "nothing written")
		assert.Nil(t, f.tmp)
	})
	for _, c := range []struct {
		name string
		f    *fakeFS
	}{
		{"wrong size there", &fakeFS{file: payload[:10]}},
		{"symlink there", &fakeFS{file: []byte("x"), mode: unix.S_IFLNK}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, phases := store(t, c.f, false)
			require.Equal(t, StatusStored, p.Status, "%v", p.Err)
			assert.Len(t, phases, 2, "the new block replaces what is there")
			assert.Equal(t, payload, c.f.file)
		})
	}
	t.Run("statx-fails", func(t *testing.T) {
		f := &fakeFS{fail: map[int]int32{2: -int32(unix.EIO)}}
		p, phases := store(t, f, false)
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.EIO)
		assert.Contains(t, p.Err.Error(), "statx /ns/")
		assert.Len(t, phases, 1)
	})
	t.Run("canceled", func(t *testing.T) {
		p := new(Program)
		require.NoError(t, p.Start(rawConfig(CorruptDefault), OpStore, key, payload, make([]byte, HeaderSize), false))
		p.Canceled = true
		phases := (&fakeFS{}).run(t, p)
		require.Equal(t, StatusFailed, p.Status)
		assert.ErrorIs(t, p.Err, syscall.ECANCELED)
		assert.Len(t, phases, 1, "nothing written once canceled")
	})
}

// TestStoreRaw: Put, Get and Verify of a raw store on the real kernel,
// through the vLLM layout.
func TestStoreRaw(t *testing.T) {
	const size = 3 * HeaderSize
	root := t.TempDir()
	s, err := Open(root, Options{Format: FormatRaw})
	require.NoError(t, err)
	require.ErrorIs(t, s.Put("ns", testKey(6, 32), make([]byte, size)), ErrInvalidOptions, "a raw Put needs the block size")
	_, err = s.Verify("", VerifyReport, nil)
	require.ErrorIs(t, err, ErrInvalidOptions, "a raw Verify needs the block size")
	s, err = Open(root, Options{Format: FormatRaw, BlockSize: size, Layout: VLLMLayout{Group: 2}})
	require.NoError(t, err)
	key := testKey(6, 32)
	payload := testPayload(key, size)
	require.ErrorIs(t, s.Put("ns", key, payload[:10]), ErrPayloadSize)
	require.NoError(t, s.Put("ns", key, payload))
	path := filepath.Join(root, "ns", string(VLLMLayout{Group: 2}.AppendPath(nil, key)))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, payload, got, "the file is the payload")

	// A second Put leaves the block alone.
	var before, after unix.Stat_t
	require.NoError(t, unix.Lstat(path, &before))
	require.NoError(t, s.Put("ns", key, payload))
	require.NoError(t, unix.Lstat(path, &after))
	assert.Equal(t, before.Ino, after.Ino, "a present block was written again")

	buf := make([]byte, size)
	n, err := s.Get("ns", key, buf)
	require.NoError(t, err)
	assert.Equal(t, size, n)
	assert.Equal(t, payload, buf)
	_, err = s.Get("ns", key, buf[:size-1])
	require.ErrorIs(t, err, ErrBufferSize)

	// Corrupt files: Get reports them and leaves them; Verify finds each.
	corrupt := map[string]func(p string){
		"truncated":   func(p string) { require.NoError(t, os.WriteFile(p, payload[:100], 0o644)) },
		"extended":    func(p string) { require.NoError(t, os.WriteFile(p, append(slices.Clone(payload), 1), 0o644)) },
		"zero-length": func(p string) { require.NoError(t, os.WriteFile(p, nil, 0o644)) },
		"directory":   func(p string) { require.NoError(t, os.Mkdir(p, 0o755)) },
		"symlink":     func(p string) { require.NoError(t, os.Symlink(path, p)) },
		"fifo":        func(p string) { require.NoError(t, unix.Mkfifo(p, 0o644)) },
	}
	paths := map[string]string{}
	for i := 0; i < len(corrupt); i++ {
		k := testKey(100+i, 32)
		name := slices.Sorted(mapKeys(corrupt))[i]
		p := filepath.Join(root, "ns", string(VLLMLayout{Group: 2}.AppendPath(nil, k)))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		corrupt[name](p)
		paths[name] = p
		_, err := s.Get("ns", k, buf)
		require.ErrorIs(t, err, ErrCorrupt, name)
		_, err = os.Lstat(p)
		require.NoError(t, err, "%s: Get removed the file", name)
	}
	var problems []string
	stats, err := s.Verify("ns", VerifyReport, func(p Problem) { problems = append(problems, p.Block.Path) })
	require.NoError(t, err)
	// Scan walks regular files only: the directory, link and FIFO are
	// no blocks to it.
	assert.Equal(t, int64(3), stats.Corrupt, "%v", problems)
	assert.Equal(t, int64(4), stats.Blocks)
	for _, name := range []string{"truncated", "extended", "zero-length"} {
		assert.Contains(t, problems, paths[name])
	}
	stats, err = s.Verify("ns", VerifyRemove, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(3), stats.Corrupt)
	stats, err = s.Verify("ns", VerifyReport, nil)
	require.NoError(t, err)
	assert.Equal(t, VerifyStats{Blocks: 1, Bytes: size}, stats, "only the good block is left")
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestCleanVLLMTemps: Clean removes stale "_<digits>.tmp" files, vLLM's
// and ours alike, and nothing else.
func TestCleanVLLMTemps(t *testing.T) {
	root := t.TempDir()
	l := VLLMLayout{Group: 0}
	s, err := Open(root, Options{Format: FormatRaw, BlockSize: 8, Layout: l})
	require.NoError(t, err)
	key := testKey(7, 16)
	require.NoError(t, s.Put("m_0123456789ab_r0", key, []byte("12345678")))
	dir := filepath.Join(root, "m_0123456789ab_r0")
	leaf := filepath.Join(dir, string(l.AppendDir(nil, key)))
	block := filepath.Join(dir, string(l.AppendPath(nil, key)))
	stale := []string{
		block + "_4611686018427387904.tmp",                                     // vLLM's
		filepath.Join(dir, string(l.AppendTempPath(nil, key, NewTempToken()))), // ours
		filepath.Join(dir, ".o_direct_probe_77.tmp"),                           // vLLM's O_DIRECT probe
	}
	kept := []string{block, filepath.Join(leaf, "notes.tmp"), filepath.Join(leaf, "x_12a.tmp"), filepath.Join(leaf, "_.tmp")}
	old := time.Now().Add(-time.Hour)
	for _, p := range append(slices.Clone(stale), kept[1:]...) {
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
		require.NoError(t, os.Chtimes(p, old, old))
	}
	fresh := block + "_1.tmp" // a write in progress
	require.NoError(t, os.WriteFile(fresh, []byte("x"), 0o644))
	st, err := s.Clean(time.Minute)
	require.NoError(t, err)
	assert.Equal(t, int64(len(stale)), st.Removed)
	for _, p := range stale {
		assert.NoFileExists(t, p)
	}
	for _, p := range append(kept, fresh) {
		assert.FileExists(t, p)
	}
}
