package blockstore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The lease tests' child processes: the test binary re-executed with
// leaseHelperEnv set to a role runs leaseHelper from TestMain, which plays
// it on the directory in leaseHelperDirEnv.
const (
	leaseHelperEnv     = "BLOCKSTORE_LEASE_HELPER" // "hold" or "try"
	leaseHelperDirEnv  = "BLOCKSTORE_LEASE_DIR"
	leaseHelperCmdEnv  = "BLOCKSTORE_LEASE_CLASSIC" // "1": the child uses classic locks
	leaseHeldLine      = "held"
	leaseRefusedLine   = "refused"
	leaseReleaseWithin = 5 * time.Second
)

// leaseHelper is the body of the lease tests' child processes, in role.
// "hold" takes the lease, publishes, prints leaseHeldLine and waits to be
// killed; "try" prints leaseHeldLine or leaseRefusedLine. It exits.
func leaseHelper(role string) {
	if os.Getenv(leaseHelperCmdEnv) == "1" {
		leaseLockCmd = unix.F_SETLK
	}
	dir := os.Getenv(leaseHelperDirEnv)
	l, err := TryLease(dir, fmt.Sprintf("child pid %d", os.Getpid()))
	switch {
	case role == "try" && errors.Is(err, ErrLeaseHeld):
		fmt.Println(leaseRefusedLine)
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	if role == "hold" {
		if err := l.Publish([]byte("child state")); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
	}
	fmt.Println(leaseHeldLine)
	if role == "hold" {
		time.Sleep(time.Minute) // the parent kills long before
	}
	os.Exit(0)
}

// leaseChild starts the test binary as a lease child in role on dir and
// returns it with the first line it printed.
func leaseChild(t *testing.T, role, dir string, classicLock bool) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaseHelperEnv+"="+role, leaseHelperDirEnv+"="+dir, "GORACE=atexit_sleep_ms=0")
	if classicLock {
		cmd.Env = append(cmd.Env, leaseHelperCmdEnv+"=1")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the child's first line; its stderr: %s", &stderr)
	return cmd, strings.TrimSpace(line)
}

// TestLease takes, refuses and hands over the lease within one process:
// OFD locks exclude each other per open file, not per process.
func TestLease(t *testing.T) {
	dir := t.TempDir()
	a, err := TryLease(dir, "a")
	require.NoError(t, err)
	_, err = TryLease(dir, "b")
	require.ErrorIs(t, err, ErrLeaseHeld, "a second TryLease in the holder's process")
	holder, state, err := ReadLease(dir)
	require.NoError(t, err)
	assert.Equal(t, "a", holder)
	assert.Empty(t, state)
	require.NoError(t, a.Check())

	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Close(), fs.ErrClosed)
	require.ErrorIs(t, a.Publish(nil), fs.ErrClosed)
	require.ErrorIs(t, a.Check(), fs.ErrClosed)
	st, err := os.Stat(filepath.Join(dir, LeaseName))
	require.NoError(t, err, "the lease file stays after Close")
	assert.True(t, st.Mode().IsRegular())

	b, err := TryLease(dir, "b")
	require.NoError(t, err, "TryLease after the holder's Close")
	holder, _, err = ReadLease(dir)
	require.NoError(t, err)
	assert.Equal(t, "b", holder)
	require.NoError(t, b.Close())
}

// TestLeasePublish publishes states of several lengths, each replacing the
// last, and reads each back whole: a shorter state leaves nothing of a
// longer one behind.
func TestLeasePublish(t *testing.T) {
	dir := t.TempDir()
	l, err := TryLease(dir, "host pid 123")
	require.NoError(t, err)
	defer l.Close()
	for _, state := range [][]byte{
		[]byte("evicting: used 9000 of 10000 bytes"),
		bytes.Repeat([]byte("long state\n"), 300),
		[]byte("short"),
		{},
		[]byte("\nstarts with a newline"),
		bytes.Repeat([]byte{'x'}, LeaseStateSizeMax),
		[]byte("x"),
	} {
		require.NoError(t, l.Publish(state))
		holder, got, err := ReadLease(dir)
		require.NoError(t, err)
		require.Equal(t, "host pid 123", holder)
		require.Equal(t, string(state), string(got), "state of %d bytes", len(state))
		st, err := os.Stat(filepath.Join(dir, LeaseName))
		require.NoError(t, err)
		require.Equal(t, int64(len("host pid 123\n")+len(state)), st.Size(), "the file after a state of %d bytes", len(state))
	}
	err = l.Publish(make([]byte, LeaseStateSizeMax+1))
	require.ErrorIs(t, err, ErrPayloadSize)
}

// TestLeasePublishAllocs: Publish, called about once a second for as long
// as the process maintains, allocates nothing once its buffer has grown.
func TestLeasePublishAllocs(t *testing.T) {
	l, err := TryLease(t.TempDir(), "a")
	require.NoError(t, err)
	defer l.Close()
	state := bytes.Repeat([]byte{'s'}, 300)
	require.NoError(t, l.Publish(state))
	allocs := testing.AllocsPerRun(50, func() {
		if err := l.Publish(state); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "allocations per Publish")
}

// TestLeaseBadInput covers a missing lease file, a bad holder, and things
// that are not a lease file where it should be.
func TestLeaseBadInput(t *testing.T) {
	dir := t.TempDir()
	_, _, err := ReadLease(dir)
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, _, err = ReadLease(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, err = TryLease(filepath.Join(dir, "missing"), "a")
	require.ErrorIs(t, err, fs.ErrNotExist, "TryLease does not create the directory")

	_, err = TryLease(dir, "two\nlines")
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = TryLease(dir, strings.Repeat("h", leaseHolderSizeMax+1))
	require.ErrorIs(t, err, ErrInvalidOptions)

	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, "target"), nil, 0o644))
	require.NoError(t, os.Symlink(filepath.Join(other, "target"), filepath.Join(dir, LeaseName)))
	_, err = TryLease(dir, "a")
	require.ErrorIs(t, err, unix.ELOOP, "a symlink at the lease path is not followed")
	_, _, err = ReadLease(dir)
	require.ErrorIs(t, err, unix.ELOOP)

	fifoDir := t.TempDir()
	require.NoError(t, unix.Mkfifo(filepath.Join(fifoDir, LeaseName), 0o644))
	_, err = TryLease(fifoDir, "a")
	require.ErrorIs(t, err, ErrCorrupt, "a FIFO at the lease path")
	_, _, err = ReadLease(fifoDir)
	require.ErrorIs(t, err, ErrCorrupt)
}

// TestLeaseNameIsNoBlock checks that no layout takes the lease file for a
// block or a temporary file, nor the store for a namespace, and that
// maintenance leaves it alone at the root and in a namespace directory.
func TestLeaseNameIsNoBlock(t *testing.T) {
	for _, l := range []Layout{FanoutLayout{}, VLLMLayout{Group: 0}, VLLMLayout{Group: 7}} {
		_, ok := l.KeyFromPath(LeaseName)
		assert.False(t, ok, "%T%+v takes %s for a block", l, l, LeaseName)
		assert.False(t, l.IsTempPath(LeaseName), "%T%+v takes %s for a temporary file", l, l, LeaseName)
	}
	require.Error(t, ValidateNamespace(LeaseName))

	s := openTestStore(t, Options{})
	require.NoError(t, s.Put("ns", testKey(1, 32), []byte("payload")))
	nsDir, err := s.NamespaceDir("ns")
	require.NoError(t, err)
	var leases []*Lease
	for _, dir := range []string{s.Root(), nsDir} {
		l, err := TryLease(dir, "maintainer")
		require.NoError(t, err)
		leases = append(leases, l)
	}
	nss, err := s.Namespaces()
	require.NoError(t, err)
	assert.Equal(t, []string{"ns"}, nss)
	var scanned []string
	require.NoError(t, s.Scan("ns", func(b BlockInfo) error { scanned = append(scanned, b.Path); return nil }))
	assert.Len(t, scanned, 1, "Scan finds the block and nothing else")
	cleaned, err := s.Clean(0)
	require.NoError(t, err)
	assert.Zero(t, cleaned.Removed)
	x, err := s.NewIndex("ns")
	require.NoError(t, err)
	require.NoError(t, x.Scan(nil))
	blocks, _ := x.Usage()
	assert.Equal(t, int64(1), blocks, "an Index counts the block and nothing else")
	for _, l := range leases {
		require.NoError(t, l.Check(), "the lease file %s survives Scan, Clean and an Index", l.path)
		require.NoError(t, l.Close())
	}
}

// TestLeaseCheck: Check holds while the lease file is in place and fails
// with ErrLeaseLost once it was removed or replaced, when another can lock
// the new file.
func TestLeaseCheck(t *testing.T) {
	for _, how := range []string{"remove", "replace"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			l, err := TryLease(dir, "a")
			require.NoError(t, err)
			defer l.Close()
			require.NoError(t, l.Check())
			path := filepath.Join(dir, LeaseName)
			switch how {
			case "remove":
				require.NoError(t, os.Remove(path))
			case "replace":
				require.NoError(t, os.WriteFile(path+".new", nil, 0o644))
				require.NoError(t, os.Rename(path+".new", path))
			}
			require.ErrorIs(t, l.Check(), ErrLeaseLost)
			b, err := TryLease(dir, "b")
			require.NoError(t, err, "another takes the lease on the new file: why Check looks at the path")
			require.NoError(t, b.Check())
			require.ErrorIs(t, l.Check(), ErrLeaseLost)
			require.NoError(t, b.Close())
		})
	}
}

// TestLeaseRace has goroutines take and give back the lease as fast as
// they can until each has held it leaseRaceTurns times: never two hold it
// at once, and none waits forever.
func TestLeaseRace(t *testing.T) {
	dir := t.TempDir()
	const workers, leaseRaceTurns = 8, 10
	deadline := time.Now().Add(20 * time.Second)
	var holders atomic.Int32
	var refusals atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*(3*leaseRaceTurns+1)) // room for every error a worker can send
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for turns := 0; turns < leaseRaceTurns; {
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("worker %d held the lease %d times in 20s", w, turns)
					return
				}
				l, err := TryLease(dir, fmt.Sprint("worker ", w))
				if errors.Is(err, ErrLeaseHeld) {
					refusals.Add(1)
					time.Sleep(time.Duration(w) * 10 * time.Microsecond)
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				turns++
				if n := holders.Add(1); n != 1 {
					errs <- fmt.Errorf("worker %d holds the lease with %d others", w, n-1)
				}
				if err := l.Publish([]byte(fmt.Sprint("state of ", w))); err != nil {
					errs <- err
				}
				holders.Add(-1)
				if err := l.Close(); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Positive(t, refusals.Load(), "the workers never contended")
}

// TestLeaseHolderKilled: a holder in another process excludes this one;
// killed with SIGKILL, it leaves the lease to be taken within
// leaseReleaseWithin.
func TestLeaseHolderKilled(t *testing.T) {
	dir := t.TempDir()
	cmd, line := leaseChild(t, "hold", dir, false)
	require.Equal(t, leaseHeldLine, line)
	_, err := TryLease(dir, "parent")
	require.ErrorIs(t, err, ErrLeaseHeld, "while the child holds the lease")
	holder, state, err := ReadLease(dir)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("child pid %d", cmd.Process.Pid), holder)
	assert.Equal(t, "child state", string(state))

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	var l *Lease
	require.Eventually(t, func() bool {
		l, err = TryLease(dir, "parent")
		return err == nil
	}, leaseReleaseWithin, 10*time.Millisecond, "the lease after its holder was killed: %v", err)
	t.Logf("taken %v after the kill", time.Since(killed))
	require.NoError(t, l.Close())
}

// TestLeaseClassic runs the fallback for filesystems without OFD locks
// (forced here): Leases of one process still exclude each other, another
// process is excluded, and ReadLease in the holder's process does not drop
// the process's lock (a close of another descriptor of the file would).
func TestLeaseClassic(t *testing.T) {
	leaseLockCmd = unix.F_SETLK
	defer func() { leaseLockCmd = unix.F_OFD_SETLK }()
	dir := t.TempDir()
	a, err := TryLease(dir, "a")
	require.NoError(t, err)
	require.Equal(t, unix.F_SETLK, a.cmd, "the forced fallback")
	_, err = TryLease(dir, "b")
	require.ErrorIs(t, err, ErrLeaseHeld, "a second Lease in the holder's process")
	require.NoError(t, a.Publish([]byte("state")))
	for range 3 {
		holder, state, err := ReadLease(dir)
		require.NoError(t, err)
		require.Equal(t, "a", holder)
		require.Equal(t, "state", string(state))
	}
	_, line := leaseChild(t, "try", dir, true)
	require.Equal(t, leaseRefusedLine, line, "a child's TryLease after ReadLease in the holder's process")
	require.NoError(t, a.Check())

	require.NoError(t, a.Close())
	child, line := leaseChild(t, "try", dir, true)
	require.Equal(t, leaseHeldLine, line, "a child's TryLease after Close")
	require.NoError(t, child.Wait(), "the child exits, releasing the lease")
	b, err := TryLease(dir, "b")
	require.NoError(t, err)
	require.NoError(t, b.Close())
}

// BenchmarkLeasePublish measures Publish of a 256-byte state: a pwrite, an
// ftruncate and an fdatasync of one small file.
func BenchmarkLeasePublish(b *testing.B) {
	l, err := TryLease(b.TempDir(), "bench")
	require.NoError(b, err)
	defer l.Close()
	state := bytes.Repeat([]byte{'s'}, 256)
	b.ReportAllocs()
	b.SetBytes(int64(len(state)))
	for b.Loop() {
		if err := l.Publish(state); err != nil {
			b.Fatal(err)
		}
	}
}
