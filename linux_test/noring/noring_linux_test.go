package noring

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if err := InstallFilterFromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

func TestParseMode(t *testing.T) {
	for _, m := range Modes {
		got, err := ParseMode(m.String())
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	_, err := ParseMode("enosys")
	require.ErrorContains(t, err, "not a mode")
	require.Equal(t, syscall.ENOSYS, ModeENOSYS.Errno())
	require.Equal(t, syscall.EPERM, ModeEPERM.Errno())
	require.Equal(t, syscall.EPERM, ModeSysctl.Errno())
}

func TestRunPattern(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"TestA", "^TestA$"},
		{"TestA/sub", "^TestA$/^sub$"},
		{"TestA/x.y+", `^TestA$/^x\.y\+$`},
	} {
		require.Equal(t, tc.want, runPattern(tc.name), tc.name)
	}
}

// filterChecked is printed by a child of TestFilter once it has checked everything.
const filterChecked = "noring test: filter checked in mode "

// TestFilter checks in the child that all three io_uring calls are refused with the mode's errno
// on every thread, and that other system calls are not.
func TestFilter(t *testing.T) {
	for _, mode := range []Mode{ModeENOSYS, ModeEPERM} {
		t.Run(mode.String(), func(t *testing.T) {
			if m, ok := InChild(); ok {
				require.Equal(t, mode, m)
				// Arguments the kernel would refuse otherwise (params NULL: EFAULT; fd -1: EBADF).
				for _, nr := range []uintptr{unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER} {
					_, _, errno := unix.Syscall6(nr, ^uintptr(0), 0, 0, 0, 0, 0)
					if nr == unix.SYS_IO_URING_SETUP {
						_, _, errno = unix.Syscall(nr, 0, 0, 0)
					}
					require.Equal(t, mode.Errno(), errno, "system call %d", nr)
				}
				_, _, errno := unix.Syscall(unix.SYS_CLOSE, ^uintptr(0), 0, 0)
				require.Equal(t, unix.EBADF, errno, "close(-1) must reach the kernel")
				require.Equal(t, os.Getpid(), unix.Getpid())

				// TSYNC gave the filter to every thread that existed; threads started since
				// inherit it. /proc shows the mode per thread (2 is SECCOMP_MODE_FILTER).
				threads, err := filepath.Glob("/proc/self/task/*/status")
				require.NoError(t, err)
				require.NotEmpty(t, threads)
				for _, status := range threads {
					b, err := os.ReadFile(status)
					if os.IsNotExist(err) {
						continue // the thread exited
					}
					require.NoError(t, err)
					require.Contains(t, string(b), "\nSeccomp:\t2\n", status)
					require.Contains(t, string(b), "\nNoNewPrivs:\t1\n", status)
				}
				t.Logf("%d threads filtered", len(threads))
				fmt.Println(filterChecked + mode.String())
				return
			}
			out := Run(t, mode, t.Name())
			require.Contains(t, out, filterChecked+mode.String())
		})
	}
}

// recorder stands in for the testing.TB given to Run, to see Run fail and skip.
type recorder struct {
	testing.TB        // the real test, for Helper and Name
	failed     bool   // set by Errorf and Fatalf
	skipped    bool   // set by Skipf
	msg        string // the last message
}

func (r *recorder) Errorf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Logf(string, ...any) {}

// runRecorded calls Run on its own goroutine, so that Fatalf and Skipf can end it.
func runRecorded(t *testing.T, mode Mode, testName string) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(r, mode, testName)
	}()
	<-done
	return r
}

// TestRunReports checks that Run fails or skips its test when the child's test did not pass.
func TestRunReports(t *testing.T) {
	t.Run("failure", func(t *testing.T) {
		if _, ok := InChild(); ok {
			t.Error("deliberate failure in the child")
			return
		}
		r := runRecorded(t, ModeENOSYS, t.Name())
		require.True(t, r.failed)
		require.False(t, r.skipped)
		require.Contains(t, r.msg, "failed: exit status 1")
		require.Contains(t, r.msg, "deliberate failure in the child")
	})
	t.Run("skip", func(t *testing.T) {
		if _, ok := InChild(); ok {
			t.Skip("deliberate skip in the child")
		}
		r := runRecorded(t, ModeEPERM, t.Name())
		require.False(t, r.failed)
		require.True(t, r.skipped)
		require.Contains(t, r.msg, "deliberate skip in the child")
	})
	t.Run("misspelt", func(t *testing.T) {
		r := runRecorded(t, ModeENOSYS, t.Name()+"_typo")
		require.True(t, r.failed)
		require.Contains(t, r.msg, "did not run in the child")
	})
	t.Run("nested", func(t *testing.T) {
		if _, ok := InChild(); ok {
			r := runRecorded(t, ModeENOSYS, t.Name())
			require.True(t, r.failed)
			require.Contains(t, r.msg, "called in a child")
			fmt.Println("noring test: nested Run refused")
			return
		}
		out := Run(t, ModeENOSYS, t.Name())
		require.Contains(t, out, "noring test: nested Run refused")
	})
}

// TestDisableSysctl checks the save, restore and crash-recovery logic of ModeSysctl on plain files.
func TestDisableSysctl(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return strings.TrimSpace(string(b))
	}
	for _, tc := range []struct {
		name     string
		sysctl   string // before
		recorded string // in the lock file before: left by a run that died
		want     string // restored at the end
	}{
		{name: "restores", sysctl: "0", want: "0"},
		{name: "restores 1", sysctl: "1", want: "1"},
		{name: "already 2", sysctl: "2", want: "2"},
		{name: "earlier run died", sysctl: "2", recorded: "1", want: "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sysctl, lock := filepath.Join(dir, "io_uring_disabled"), filepath.Join(dir, "lock")
			require.NoError(t, os.WriteFile(sysctl, []byte(tc.sysctl+"\n"), 0o600))
			if tc.recorded != "" {
				require.NoError(t, os.WriteFile(lock, []byte(tc.recorded+"\n"), 0o600))
			}
			restore, err := disableSysctl(sysctl, lock)
			require.NoError(t, err)
			assert.Equal(t, "2", read(sysctl))
			assert.Equal(t, tc.want, read(lock), "the value to restore is recorded")
			require.NoError(t, restore())
			assert.Equal(t, tc.want, read(sysctl))
			assert.Empty(t, read(lock), "the record is cleared")
		})
	}
	t.Run("write fails", func(t *testing.T) {
		dir := t.TempDir()
		sysctl, lock := filepath.Join(dir, "io_uring_disabled"), filepath.Join(dir, "lock")
		require.NoError(t, os.WriteFile(sysctl, []byte("0\n"), 0o400))
		if os.Geteuid() == 0 {
			// root writes read-only files; a directory cannot be opened for writing by anyone.
			require.NoError(t, os.Remove(sysctl))
			require.NoError(t, os.Mkdir(sysctl, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(sysctl, "x"), nil, 0o600)) // readSysctl must fail too
		}
		_, err := disableSysctl(sysctl, lock)
		require.Error(t, err)
		assert.Empty(t, read(lock), "nothing recorded after a failed start")
		// The mutex and the flock were released: the next run proceeds.
		require.NoError(t, os.RemoveAll(sysctl))
		require.NoError(t, os.WriteFile(sysctl, []byte("0\n"), 0o600))
		restore, err := disableSysctl(sysctl, lock)
		require.NoError(t, err)
		require.NoError(t, restore())
		assert.Equal(t, "0", read(sysctl))
	})
}

// TestRunSysctl runs a child with the real sysctl at 2 and checks it is restored.
func TestRunSysctl(t *testing.T) {
	if m, ok := InChild(); ok {
		require.Equal(t, ModeSysctl, m)
		// The sysctl refuses only new rings: io_uring_enter still reaches the kernel.
		_, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 0, 0, 0)
		require.Equal(t, unix.EPERM, errno)
		_, _, errno = unix.Syscall6(unix.SYS_IO_URING_ENTER, ^uintptr(0), 0, 0, 0, 0, 0)
		require.Equal(t, unix.EBADF, errno)
		fmt.Println("noring test: sysctl checked")
		return
	}
	if err := Available(ModeSysctl); err != nil {
		t.Skip(err)
	}
	before, err := readSysctl(sysctlPath)
	require.NoError(t, err)
	out := Run(t, ModeSysctl, t.Name())
	require.Contains(t, out, "noring test: sysctl checked")
	after, err := readSysctl(sysctlPath)
	require.NoError(t, err)
	require.Equal(t, before, after, "sysctl restored")
	b, err := os.ReadFile(sysctlLockPath)
	require.NoError(t, err)
	require.Empty(t, b, "record cleared")
}
