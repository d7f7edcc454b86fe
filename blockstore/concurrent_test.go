package blockstore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The test binary re-executes itself as a child writer process when
// childEnv names a role; see runChild.
const childEnv = "BLOCKSTORE_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(leaseHelperEnv); role != "" {
		leaseHelper(role)
	}
	if role := os.Getenv(childEnv); role != "" {
		if err := runChild(role, os.Getenv("BLOCKSTORE_TEST_ROOT")); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// Shared parameters of the concurrent writers: every writer of key i
// writes testPayload(testKey(i, 32), concurrentSize).
const (
	concurrentKeys   = 4
	concurrentSize   = 1 << 20
	concurrentRounds = 8
)

// concurrentPayloads holds the payload of each concurrent key, computed once.
var concurrentPayloads = sync.OnceValue(func() [][]byte {
	var out [][]byte
	for i := 0; i < concurrentKeys; i++ {
		out = append(out, testPayload(testKey(i, 32), concurrentSize))
	}
	return out
})

// runChild runs a child process's role:
//   - "put": once released through stdin, Put and Get every concurrent
//     key, concurrentRounds times, checking each read.
//   - "kill": start a Put, and once its header is written print "ready"
//     and wait to be killed.
func runChild(role, root string) error {
	s, err := Open(root, Options{})
	if err != nil {
		return err
	}
	switch role {
	case "put":
		// Start together with the other writers: report ready, wait for go.
		fmt.Println("ready")
		if _, err := os.Stdin.Read(make([]byte, 1)); err != nil {
			return err
		}
		return putAndCheck(s, 0)
	case "kill":
		// Writes of at most a header's size: the header is written
		// alone, not in one write with the payload.
		RWMax = HeaderSize
		writes := 0
		s.hooks = &testHooks{write: func() error {
			if writes++; writes == 2 {
				fmt.Println("ready")
				select {} // until SIGKILL
			}
			return nil
		}}
		k := testKey(0, 32)
		return s.Put("ns", k, testPayload(k, concurrentSize))
	}
	return fmt.Errorf("unknown role %q", role)
}

// putAndCheck writes every concurrent key and reads each back whole.
func putAndCheck(s *Store, worker int) error {
	buf := make([]byte, concurrentSize)
	for r := 0; r < concurrentRounds; r++ {
		for i := 0; i < concurrentKeys; i++ {
			k := testKey((i+worker)%concurrentKeys, 32)
			want := concurrentPayloads()[(i+worker)%concurrentKeys]
			if err := s.Put("ns", k, want); err != nil {
				return err
			}
			n, err := s.Get("ns", k, buf)
			if err != nil {
				return err
			}
			if !bytes.Equal(buf[:n], want) {
				return fmt.Errorf("key %x: read differs from what every writer writes", k)
			}
		}
	}
	return nil
}

// readUntil reads every concurrent key until stop is closed: each read is a
// miss (not yet published) or the whole block, never corrupt or partial.
func readUntil(s *Store, stop <-chan struct{}) (hits int, err error) {
	buf := make([]byte, concurrentSize)
	for {
		for i := 0; i < concurrentKeys; i++ {
			k := testKey(i, 32)
			n, err := s.Get("ns", k, buf)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return hits, err
			}
			if !bytes.Equal(buf[:n], concurrentPayloads()[i]) {
				return hits, fmt.Errorf("key %x: partial or wrong block", k)
			}
			hits++
		}
		select {
		case <-stop:
			return hits, nil
		default:
		}
	}
}

// checkQuiescent asserts that no temporary file is left and every block
// verifies.
func checkQuiescent(t *testing.T, s *Store) {
	t.Helper()
	for _, f := range listFiles(t, s.Root()) {
		assert.NotContains(t, f, ".tmp.", "temporary file left behind")
	}
	stats, err := s.Verify("", VerifyReport, nil)
	require.NoError(t, err)
	assert.Equal(t, VerifyStats{Blocks: concurrentKeys, Bytes: concurrentKeys * (HeaderSize + concurrentSize)}, stats)
}

func TestConcurrentGoroutines(t *testing.T) {
	s := openTestStore(t, Options{})
	stop := make(chan struct{})
	var readErr error
	var hits int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); hits, readErr = readUntil(s, stop) }()

	errs := make(chan error, 6)
	var writers sync.WaitGroup
	for w := 0; w < cap(errs); w++ {
		writers.Add(1)
		go func() { defer writers.Done(); errs <- putAndCheck(s, w) }()
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, readErr)
	assert.Positive(t, hits)
	checkQuiescent(t, s)
}

func childCommand(t *testing.T, role, root string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+role, "BLOCKSTORE_TEST_ROOT="+root)
	return cmd
}

// TestConcurrentProcesses runs writers of the same keys in three child
// processes and in this one, while this process also reads.
func TestConcurrentProcesses(t *testing.T) {
	s := openTestStore(t, Options{})
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	var gos []io.WriteCloser
	for range 3 {
		cmd := childCommand(t, "put", s.Root())
		out := new(bytes.Buffer)
		cmd.Stderr = out
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(stdout).ReadString('\n')
		require.NoError(t, err, "child: %s", out)
		require.Equal(t, "ready\n", line)
		cmds, outs, gos = append(cmds, cmd), append(outs, out), append(gos, stdin)
	}
	for _, w := range gos {
		_, err := w.Write([]byte("g"))
		require.NoError(t, err)
		require.NoError(t, w.Close())
	}
	stop := make(chan struct{})
	var readErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, readErr = readUntil(s, stop) }()
	putErr := putAndCheck(s, 1)
	for i, cmd := range cmds {
		assert.NoError(t, cmd.Wait(), "child %d: %s", i, outs[i])
	}
	close(stop)
	wg.Wait()
	require.NoError(t, putErr)
	require.NoError(t, readErr)
	checkQuiescent(t, s)
}

// TestKilledWriter kills a child process part-way through a Put: only its
// temporary file is left, the block is not visible, and Clean removes it.
func TestKilledWriter(t *testing.T) {
	s := openTestStore(t, Options{})
	cmd := childCommand(t, "kill", s.Root())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())

	files := listFiles(t, s.Root())
	require.Len(t, files, 1)
	assert.Contains(t, files[0], ".blk.tmp."+strconv.Itoa(cmd.Process.Pid)+".")
	k := testKey(0, 32)
	ok, err := s.Has("ns", k)
	require.NoError(t, err)
	assert.False(t, ok)

	stats, err := s.Clean(time.Hour)
	require.NoError(t, err)
	assert.Zero(t, stats.Removed, "too young to clean")
	stats, err = s.Clean(0)
	require.NoError(t, err)
	assert.Equal(t, CleanStats{Removed: 1, Bytes: HeaderSize}, stats)
	assert.Empty(t, listFiles(t, s.Root()))
}
