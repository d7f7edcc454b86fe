package faultfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// mount mounts a fresh backing directory and unmounts it when the test ends, checking that the mount
// is gone.
func mount(t *testing.T, opts Options) (fsys *FS, mnt, backing string) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err.Error())
	}
	mnt, backing = t.TempDir(), t.TempDir()
	fsys, err := Mount(mnt, backing, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, fsys.Unmount())
		assert.False(t, Mounted(mnt), "still mounted on %s", mnt)
	})
	return fsys, mnt, backing
}

func statx(p string) (unix.Statx_t, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, p, 0, unix.STATX_BASIC_STATS, &stx)
	if err != nil {
		err = &os.PathError{Op: "statx", Path: p, Err: err}
	}
	return stx, err
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func TestPassThrough(t *testing.T) {
	fsys, mnt, backing := mount(t, Options{})
	probe, err := fsys.Inject(Fault{Ops: OpAll}) // counts only
	require.NoError(t, err)

	require.NoError(t, os.Mkdir(filepath.Join(mnt, "d"), 0o755))
	data := []byte("hello, faultfs")
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "d", "a.tmp"), data, 0o644))
	require.NoError(t, os.Rename(filepath.Join(mnt, "d", "a.tmp"), filepath.Join(mnt, "d", "a")))

	got, err := os.ReadFile(filepath.Join(backing, "d", "a"))
	require.NoError(t, err)
	assert.Equal(t, data, got, "backing file after write through the mount")
	got, err = os.ReadFile(filepath.Join(mnt, "d", "a"))
	require.NoError(t, err)
	assert.Equal(t, data, got, "read through the mount")

	// Changes in the backing directory are visible at once: nothing is cached.
	require.NoError(t, os.WriteFile(filepath.Join(backing, "d", "b"), []byte("xy"), 0o600))
	assert.Equal(t, []string{"a", "b"}, names(t, filepath.Join(mnt, "d")))
	stx, err := statx(filepath.Join(mnt, "d", "b"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, stx.Size)
	assert.EqualValues(t, 0o600, stx.Mode&0o777)
	var st unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(backing, "d", "b"), &st))
	assert.EqualValues(t, st.Ino, stx.Ino, "inode numbers pass through")

	require.NoError(t, os.Remove(filepath.Join(mnt, "d", "b")))
	_, err = os.Stat(filepath.Join(backing, "d", "b"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = statx(filepath.Join(mnt, "d", "b"))
	assert.ErrorIs(t, err, syscall.ENOENT)
	assert.Equal(t, names(t, filepath.Join(backing, "d")), names(t, filepath.Join(mnt, "d")))

	// Writes at an offset and fsync through a descriptor.
	f, err := os.OpenFile(filepath.Join(mnt, "d", "a"), os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("HELLO"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
	got, err = os.ReadFile(filepath.Join(backing, "d", "a"))
	require.NoError(t, err)
	assert.Equal(t, "HELLO, faultfs", string(got))

	assert.Positive(t, probe.Fired(), "the counting rule saw the operations")
}

func TestLatency(t *testing.T) {
	const latency = 50 * time.Millisecond
	fsys, mnt, backing := mount(t, Options{})
	for _, name := range []string{"slow", "fast"} {
		require.NoError(t, os.WriteFile(filepath.Join(backing, name), []byte(name), 0o644))
	}
	rule, err := fsys.Inject(Fault{Ops: OpGetattr | OpLookup, Path: "slow", Latency: latency})
	require.NoError(t, err)

	start := time.Now()
	_, err = statx(filepath.Join(mnt, "slow"))
	elapsed := time.Since(start)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, elapsed, latency, "statx of a slow path")
	fired := rule.Fired()
	assert.Positive(t, fired)

	_, err = statx(filepath.Join(mnt, "fast"))
	require.NoError(t, err)
	assert.Equal(t, fired, rule.Fired(), "another path does not match")

	// Read latency, per READ request.
	readRule, err := fsys.Inject(Fault{Ops: OpRead, Path: "slow", Latency: latency})
	require.NoError(t, err)
	start = time.Now()
	got, err := os.ReadFile(filepath.Join(mnt, "slow"))
	require.NoError(t, err)
	assert.Equal(t, "slow", string(got))
	assert.GreaterOrEqual(t, time.Since(start), latency)
	assert.Positive(t, readRule.Fired())
}

func TestHangUntilRelease(t *testing.T) {
	fsys, mnt, backing := mount(t, Options{})
	for _, name := range []string{"hung", "other"} {
		require.NoError(t, os.WriteFile(filepath.Join(backing, name), nil, 0o644))
	}
	rule, err := fsys.Inject(Fault{Ops: OpGetattr | OpLookup, Path: "hung", Hang: true})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := statx(filepath.Join(mnt, "hung"))
		done <- err
	}()
	require.Eventually(t, func() bool { return fsys.Hung() == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, 1, rule.Hung())

	// Other paths are served while one operation hangs.
	_, err = statx(filepath.Join(mnt, "other"))
	require.NoError(t, err)
	select {
	case err := <-done:
		t.Fatalf("statx returned while hung: %v", err)
	default:
	}

	fsys.Release()
	select {
	case err := <-done:
		require.NoError(t, err, "statx after release")
	case <-time.After(5 * time.Second):
		t.Fatal("statx still blocked after Release")
	}
	assert.Equal(t, 0, fsys.Hung())
	assert.Positive(t, rule.Fired())

	// Released rules hang nothing more.
	_, err = statx(filepath.Join(mnt, "hung"))
	require.NoError(t, err)
}

func TestHangThenErrno(t *testing.T) {
	fsys, mnt, backing := mount(t, Options{})
	require.NoError(t, os.WriteFile(filepath.Join(backing, "f"), nil, 0o644))
	rule, err := fsys.Inject(Fault{Ops: OpOpen, Path: "f", Hang: true, Errno: syscall.ESTALE})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		f, err := os.Open(filepath.Join(mnt, "f"))
		if err == nil {
			f.Close()
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return rule.Hung() == 1 }, 5*time.Second, time.Millisecond)
	rule.Release()
	select {
	case err := <-done:
		require.ErrorIs(t, err, syscall.ESTALE)
	case <-time.After(5 * time.Second):
		t.Fatal("open still blocked after Release")
	}
}

func TestErrno(t *testing.T) {
	fsys, mnt, backing := mount(t, Options{})
	require.NoError(t, os.Mkdir(filepath.Join(backing, "bad"), 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(backing, "good"), 0o755))
	for _, dir := range []string{"bad", "good"} {
		require.NoError(t, os.WriteFile(filepath.Join(backing, dir, "f"), []byte("data"), 0o644))
	}

	stat := func(p string) error { _, err := statx(p); return err }
	open := func(p string) error {
		f, err := os.Open(p)
		if err == nil {
			f.Close()
		}
		return err
	}
	read := func(p string) error { _, err := os.ReadFile(p); return err }
	write := func(p string) error {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.Write([]byte("more"))
		return errors.Join(err, f.Close())
	}
	create := func(p string) error { return os.WriteFile(p+".new", nil, 0o644) }
	rename := func(p string) error { return os.Rename(p, p+".renamed") }
	unlink := func(p string) error { return os.Remove(p) }
	fsync := func(p string) error {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		return errors.Join(f.Sync(), f.Close())
	}
	readdir := func(p string) error { _, err := os.ReadDir(filepath.Dir(p)); return err }

	for _, tc := range []struct {
		name  string
		fault Fault
		do    func(string) error
	}{
		{"getattr EIO", Fault{Ops: OpGetattr, Path: "bad/*", Errno: syscall.EIO}, stat},
		{"lookup ESTALE", Fault{Ops: OpLookup, Path: "bad/f", Errno: syscall.ESTALE}, stat},
		{"open ESTALE", Fault{Ops: OpOpen, Path: "bad", Errno: syscall.ESTALE}, open},
		{"read EIO", Fault{Ops: OpRead, Path: "bad/*", Errno: syscall.EIO}, read},
		{"write ENOSPC", Fault{Ops: OpWrite, Path: "bad/*", Errno: syscall.ENOSPC}, write},
		{"create ENOSPC", Fault{Ops: OpCreate, Path: "bad/*", Errno: syscall.ENOSPC}, create},
		{"fsync EIO", Fault{Ops: OpFsync, Path: "bad/*", Errno: syscall.EIO}, fsync},
		{"rename EIO", Fault{Ops: OpRename, Path: "bad/*", Errno: syscall.EIO}, rename},
		{"unlink EIO", Fault{Ops: OpUnlink, Path: "bad/*", Errno: syscall.EIO}, unlink},
		{"readdir EIO", Fault{Ops: OpReaddir, Path: "bad", Errno: syscall.EIO}, readdir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule, err := fsys.Inject(tc.fault)
			require.NoError(t, err)
			defer rule.Remove()

			err = tc.do(filepath.Join(mnt, "bad", "f"))
			require.ErrorIs(t, err, tc.fault.Errno, "on the matching path")
			fired := rule.Fired()
			assert.Positive(t, fired)

			require.NoError(t, tc.do(filepath.Join(mnt, "good", "f")), "on another path")
			assert.Equal(t, fired, rule.Fired(), "the rule fired on another path")

			// Restore what the good-path call changed, so every case starts alike.
			for _, name := range []string{"f.renamed", "f.new"} {
				os.Remove(filepath.Join(backing, "good", name))
			}
			require.NoError(t, os.WriteFile(filepath.Join(backing, "good", "f"), []byte("data"), 0o644))
		})
	}
}

func TestUnmountWhileHung(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err.Error())
	}
	for _, tc := range []struct {
		name     string
		holdOpen bool // keep a descriptor open on the mount, so that only a lazy unmount works
	}{
		{"idle", false},
		{"busy", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt, backing := t.TempDir(), t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(backing, "f"), []byte("x"), 0o644))
			fsys, err := Mount(mnt, backing, Options{})
			require.NoError(t, err)
			require.True(t, Mounted(mnt))

			var open *os.File
			if tc.holdOpen {
				open, err = os.Open(filepath.Join(mnt, "f"))
				require.NoError(t, err)
				defer open.Close()
			}
			_, err = fsys.Inject(Fault{Ops: OpAll, Hang: true})
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				_, err := statx(filepath.Join(mnt, "f"))
				done <- err
			}()
			require.Eventually(t, func() bool { return fsys.Hung() > 0 }, 5*time.Second, time.Millisecond)

			require.NoError(t, fsys.Unmount())
			require.NoError(t, fsys.Unmount(), "idempotent")
			assert.False(t, Mounted(mnt), "mount left in /proc/self/mountinfo")
			select {
			case <-done: // released: succeeded, or failed with ENOTCONN if the connection was aborted
			case <-time.After(5 * time.Second):
				t.Fatal("statx still blocked after Unmount")
			}
			_, err = fsys.Inject(Fault{Ops: OpAll})
			assert.ErrorIs(t, err, ErrUnmounted)
			if tc.holdOpen {
				_, err := open.Read(make([]byte, 1))
				assert.Error(t, err, "read from a descriptor of an aborted mount")
			}
		})
	}
}

func TestFaultValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault Fault
		ok    bool
	}{
		{"count only", Fault{Ops: OpRead}, true},
		{"no ops", Fault{Path: "x", Errno: syscall.EIO}, false},
		{"unknown op", Fault{Ops: OpAll + 1}, false},
		{"bad pattern", Fault{Ops: OpRead, Path: "["}, false},
		{"negative latency", Fault{Ops: OpRead, Latency: -time.Second}, false},
	} {
		err := tc.fault.validate()
		if tc.ok {
			assert.NoError(t, err, tc.name)
		} else {
			assert.Error(t, err, tc.name)
		}
	}
}

func TestMatchPath(t *testing.T) {
	for _, tc := range []struct {
		pattern, path string
		want          bool
	}{
		{"", "a/b", true},
		{"*", ".", true},
		{"*", "a/b/c", true},
		{"blocks", "blocks", true},
		{"blocks", "blocks/ab/cd", true},
		{"blocks/*", "blocks/ab/cd", true},
		{"blocks/*", "blocks", false},
		{"blocks", "blocksx/a", false},
		{"*.tmp", "a.tmp", true},
		{"*.tmp", "d/a.tmp", false},
		{"*/*.tmp", "d/a.tmp", true},
	} {
		assert.Equal(t, tc.want, matchPath(tc.pattern, tc.path), "matchPath(%q, %q)", tc.pattern, tc.path)
	}
}

func TestOpKindString(t *testing.T) {
	assert.Equal(t, "all", OpAll.String())
	assert.Equal(t, "lookup|getattr", (OpLookup | OpGetattr).String())
	assert.Equal(t, "none", OpKind(0).String())
}

// TestInterrupt signals the thread blocked in a hung statx: the kernel sends FUSE_INTERRUPT, which ends
// an Interruptible hang with EINTR and is ignored otherwise.
func TestInterrupt(t *testing.T) {
	for _, interruptible := range []bool{true, false} {
		t.Run(fmt.Sprintf("interruptible=%v", interruptible), func(t *testing.T) {
			fsys, mnt, backing := mount(t, Options{})
			require.NoError(t, os.WriteFile(filepath.Join(backing, "f"), nil, 0o644))
			rule, err := fsys.Inject(Fault{Ops: OpGetattr, Path: "f", Hang: true, Interruptible: interruptible})
			require.NoError(t, err)

			tids := make(chan int, 1)
			done := make(chan error, 1)
			go func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				tids <- unix.Gettid()
				_, err := statx(filepath.Join(mnt, "f"))
				done <- err
			}()
			tid := <-tids
			require.Eventually(t, func() bool { return rule.Hung() == 1 }, 5*time.Second, time.Millisecond)
			// SIGURG: the Go runtime handles it (it is its preemption signal), so nothing else happens.
			require.NoError(t, unix.Tgkill(unix.Getpid(), tid, unix.SIGURG))

			if interruptible {
				select {
				case err := <-done:
					require.ErrorIs(t, err, syscall.EINTR)
				case <-time.After(5 * time.Second):
					t.Fatal("statx still blocked after the interrupt")
				}
				return
			}
			time.Sleep(50 * time.Millisecond) // give an interrupt time to (wrongly) end the hang
			select {
			case err := <-done:
				t.Fatalf("statx returned after an ignored interrupt: %v", err)
			default:
			}
			rule.Release()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("statx still blocked after Release")
			}
		})
	}
}

// TestConcurrentHangs shows that hung operations do not hold each other up: all of them are in the
// filesystem at once.
func TestConcurrentHangs(t *testing.T) {
	const n = 16
	fsys, mnt, backing := mount(t, Options{})
	for i := range n {
		require.NoError(t, os.WriteFile(filepath.Join(backing, fmt.Sprint(i)), nil, 0o644))
	}
	rule, err := fsys.Inject(Fault{Ops: OpGetattr, Hang: true})
	require.NoError(t, err)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := statx(filepath.Join(mnt, fmt.Sprint(i)))
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return fsys.Hung() == n }, 5*time.Second, time.Millisecond)
	rule.Release()
	for range n {
		require.NoError(t, <-errs)
	}
	assert.EqualValues(t, n, rule.Fired())
}

func TestRuleLifecycle(t *testing.T) {
	fsys, mnt, backing := mount(t, Options{})
	require.NoError(t, os.Mkdir(filepath.Join(backing, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(backing, "d", "a.tmp"), nil, 0o644))

	// A rename matches on its destination too; a Filter narrows further.
	// The filter runs on a server goroutine; the kernel orders it before our rename returns, but the
	// race detector cannot see that.
	var mu sync.Mutex
	var seen []Op
	rule, err := fsys.Inject(Fault{Ops: OpRename, Path: "d/final", Errno: syscall.EIO,
		Filter: func(op Op) bool { mu.Lock(); defer mu.Unlock(); seen = append(seen, op); return true }})
	require.NoError(t, err)
	runtime.LockOSThread()
	err = os.Rename(filepath.Join(mnt, "d", "a.tmp"), filepath.Join(mnt, "d", "final"))
	tid := uint32(unix.Gettid())
	runtime.UnlockOSThread()
	require.ErrorIs(t, err, syscall.EIO)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 1)
	assert.Equal(t, Op{Kind: OpRename, Path: "d/a.tmp", NewPath: "d/final", Tid: tid}, seen[0], "Tid: the thread that renamed")
	assert.Equal(t, []*Rule{rule}, fsys.Rules())

	skip, err := fsys.Inject(Fault{Ops: OpRename, Errno: syscall.ENOSPC, Filter: func(Op) bool { return false }})
	require.NoError(t, err)
	rule.Remove()
	rule.Remove() // idempotent
	assert.Equal(t, []*Rule{skip}, fsys.Rules())
	require.NoError(t, os.Rename(filepath.Join(mnt, "d", "a.tmp"), filepath.Join(mnt, "d", "final")))
	assert.EqualValues(t, 1, rule.Fired(), "a removed rule does not fire")
	assert.Zero(t, skip.Fired(), "filtered out operations are not counted")

	fsys.Reset()
	assert.Empty(t, fsys.Rules())
	_, err = fsys.Inject(Fault{})
	assert.Error(t, err)
}

func TestCacheOption(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   Options
		cached bool
	}{
		{"uncached", Options{}, false},
		{"cached", Options{EntryTimeout: time.Hour, AttrTimeout: time.Hour}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys, mnt, backing := mount(t, tc.opts)
			require.NoError(t, os.WriteFile(filepath.Join(backing, "f"), nil, 0o644))
			probe, err := fsys.Inject(Fault{Ops: OpLookup | OpGetattr, Path: "f"})
			require.NoError(t, err)
			_, err = statx(filepath.Join(mnt, "f"))
			require.NoError(t, err)
			first := probe.Fired()
			require.Positive(t, first)
			_, err = statx(filepath.Join(mnt, "f"))
			require.NoError(t, err)
			if tc.cached {
				assert.Equal(t, first, probe.Fired(), "second statx served from the kernel's cache")
			} else {
				assert.Greater(t, probe.Fired(), first, "second statx reached the filesystem")
			}
		})
	}
}

func TestMountErrors(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err.Error())
	}
	dir := t.TempDir()
	_, err := Mount(dir, filepath.Join(dir, "missing"), Options{})
	assert.Error(t, err)
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = Mount(file, dir, Options{})
	assert.Error(t, err)
	_, err = Mount(t.TempDir(), dir, Options{AttrTimeout: -time.Second})
	assert.Error(t, err)
}
