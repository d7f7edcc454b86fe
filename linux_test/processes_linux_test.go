package linux_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

// Child processes: the test binary re-executes itself with childEnv set to a role; TestMain runs
// the role instead of the tests. The role's parameters travel in the environment too.
const (
	childEnv       = "URINGTIER_LINUX_TEST_CHILD" // "crash" or "mix"
	childDirEnv    = "URINGTIER_LINUX_TEST_DIR"
	childEngineEnv = "URINGTIER_LINUX_TEST_ENGINE"
	childSeedEnv   = "URINGTIER_LINUX_TEST_SEED"

	crashBlockSize = 64 << 10 // large enough that a kill often lands mid-write
	mixBlockSize   = 16 << 10
	mixKeySpace    = 48
	mixDuration    = 1500 * time.Millisecond
	storingLine    = "child: storing"
)

// runChildRole runs the role named by childEnv, if any, and reports whether it did and its exit
// code.
func runChildRole() (int, bool) {
	role := os.Getenv(childEnv)
	if role == "" {
		return 0, false
	}
	kind, err := tier.ParseEngine(os.Getenv(childEngineEnv))
	if err == nil {
		var seed uint64
		if seed, err = strconv.ParseUint(os.Getenv(childSeedEnv), 10, 64); err == nil {
			dir := os.Getenv(childDirEnv)
			switch role {
			case "crash":
				err = crashChild(dir, kind, seed)
			case "mix":
				err = mixChild(dir, kind, seed)
			case "evict":
				err = evictChild(dir, kind, seed)
			default:
				err = fmt.Errorf("unknown role %q", role)
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
		return 1, true
	}
	return 0, true
}

// childCommand returns a command re-running this test binary in role.
func childCommand(role, dir string, kind tier.EngineKind, seed uint64) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+role, childDirEnv+"="+dir, childEngineEnv+"="+kind.String(),
		childSeedEnv+"="+strconv.FormatUint(seed, 10), "GORACE=atexit_sleep_ms=0")
	return cmd, nil
}

// pollOne waits for request req's Result on tr.
func pollOne(tr *tier.Tier, req uint64, results []tier.Result) (tier.Result, error) {
	timeout := time.After(30 * time.Second)
	for {
		n := tr.Poll(results)
		for _, r := range results[:n] {
			if r.Req == req && r.Op != tier.OpRelease {
				return r, nil
			}
		}
		if n > 0 {
			continue
		}
		select {
		case <-tr.Ready():
		case <-timeout:
			return tier.Result{}, fmt.Errorf("no result for request %d in 30s", req)
		}
	}
}

// crashChild stores random blocks through the tier, batch after batch, until it is killed.
func crashChild(dir string, kind tier.EngineKind, seed uint64) error {
	tr, err := tier.Open(dir, tier.Options{BlockSize: crashBlockSize, Engine: kind, Rings: 2, OpsMax: 64})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	results := make([]tier.Result, 4)
	bufs := make([][]byte, 32)
	for i := range bufs {
		bufs[i] = make([]byte, crashBlockSize)
	}
	deadline := time.Now().Add(20 * time.Second) // the parent kills long before
	for req := uint64(0); time.Now().Before(deadline); req++ {
		idx := make([]int, len(bufs))
		for j := range idx {
			idx[j] = rng.IntN(1 << 16)
			copy(bufs[j], payload(idx[j], crashBlockSize))
		}
		if err := tr.Store(req, keys(idx...), bufs); err != nil {
			return err
		}
		if req == 0 {
			fmt.Println(storingLine)
		}
		r, err := pollOne(tr, req, results)
		if err != nil {
			return err
		}
		for j, k := range r.Keys {
			if !k.Status.OK() {
				return fmt.Errorf("store of key %d: %v %v", idx[j], k.Status, k.Err)
			}
		}
	}
	return errors.New("not killed")
}

// mixChild stores, loads and looks up random keys of a small shared key space for mixDuration,
// checking that every load is a whole, valid block or a miss.
func mixChild(dir string, kind tier.EngineKind, seed uint64) error {
	tr, err := tier.Open(dir, tier.Options{BlockSize: mixBlockSize, Engine: kind, Rings: 2, OpsMax: 64})
	if err != nil {
		return err
	}
	defer tr.Close(context.Background())
	rng := rand.New(rand.NewPCG(seed, 2))
	results := make([]tier.Result, 4)
	var loaded, missing, stored, found int
	end := time.Now().Add(mixDuration)
	for req := uint64(0); time.Now().Before(end); req++ {
		idx := make([]int, 1+rng.IntN(8))
		for j := range idx {
			idx[j] = rng.IntN(mixKeySpace)
		}
		bufs := make([][]byte, len(idx))
		op := rng.IntN(3)
		for j := range bufs {
			if op == 0 {
				bufs[j] = payload(idx[j], mixBlockSize)
			} else {
				bufs[j] = make([]byte, mixBlockSize)
			}
		}
		switch op {
		case 0:
			err = tr.Store(req, keys(idx...), bufs)
		case 1:
			err = tr.Load(req, keys(idx...), bufs)
		case 2:
			err = tr.Lookup(req, keys(idx...))
		}
		if err != nil {
			return err
		}
		r, err := pollOne(tr, req, results)
		if err != nil {
			return err
		}
		for j, k := range r.Keys {
			switch {
			case op == 0 && k.Status.OK():
				stored++
			case op == 1 && k.Status == tier.StatusLoaded:
				if !bytes.Equal(bufs[j], payload(idx[j], mixBlockSize)) {
					return fmt.Errorf("seed %d request %d: load of key %d returned wrong bytes", seed, req, idx[j])
				}
				loaded++
			case op == 2 && k.Status == tier.StatusFound:
				found++
			case op != 0 && k.Status == tier.StatusMissing:
				missing++
			default:
				return fmt.Errorf("seed %d request %d (%v): key %d: %v %v", seed, req, r.Op, idx[j], k.Status, k.Err)
			}
		}
	}
	fmt.Printf("child: stored %d loaded %d found %d missing %d\n", stored, loaded, found, missing)
	return nil
}

// TestCrashes kills a child process storing blocks through the tier with SIGKILL at random points,
// many times, for each engine: afterwards Verify finds no corrupt visible block and Clean removes
// every temporary file the children left.
func TestCrashes(t *testing.T) {
	// At least kills kills, and more (up to killsMax) until one has landed
	// mid-store: a kill between two batches leaves nothing to find.
	const kills, killsMax = 12, 48
	engines(t, func(t *testing.T, kind tier.EngineKind) {
		seed := uint64(time.Now().UnixNano())
		rng := rand.New(rand.NewPCG(seed, 3))
		dir := t.TempDir()
		store, err := blockstore.Open(dir, blockstore.Options{})
		require.NoError(t, err)
		ns := "default"
		n := killStoringChildren(t, killPlan{kills, killsMax, 40 * time.Millisecond, true}, dir, kind, rng, seed, store, ns)

		left := tempFiles(t, store, ns)
		vs := verifyClean(t, store, ns, fmt.Sprintf("seed %d", seed))
		require.Positive(t, vs.Blocks, "seed %d: no block was published", seed)
		cs, err := store.Clean(0)
		require.NoError(t, err)
		assert.Equal(t, int64(len(left)), cs.Removed, "seed %d: Clean", seed)
		assert.Empty(t, tempFiles(t, store, ns), "seed %d: temporary files after Clean", seed)
		t.Logf("seed %d: %d kills; %d whole blocks, %d temporary files left and cleaned", seed, n, vs.Blocks, len(left))
		assert.Positive(t, len(left), "seed %d: no kill landed mid-store", seed)
	})
}

// TestSeveralProcesses runs four processes (two per engine) storing, loading and looking up
// overlapping keys of one directory at once: every load is a whole block with the right bytes, or
// a miss; nothing is corrupt or left temporary afterwards.
func TestSeveralProcesses(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	dir := t.TempDir()
	type child struct {
		cmd    *exec.Cmd
		out    bytes.Buffer
		engine tier.EngineKind
	}
	var children []*child
	for n, kind := range []tier.EngineKind{tier.EngineURing, tier.EngineSync, tier.EngineURing, tier.EngineSync} {
		cmd, err := childCommand("mix", dir, kind, seed+uint64(n))
		require.NoError(t, err)
		c := &child{cmd: cmd, engine: kind}
		cmd.Stdout, cmd.Stderr = &c.out, &c.out
		require.NoError(t, cmd.Start())
		children = append(children, c)
	}
	for n, c := range children {
		err := c.cmd.Wait()
		require.NoError(t, err, "seed %d child %d (%v): %s", seed, n, c.engine, c.out.String())
		out := c.out.String()
		require.Contains(t, out, "child: stored", "seed %d child %d (%v): %s", seed, n, c.engine, out)
		var stored, loaded, found, missing int
		_, err = fmt.Sscanf(out[strings.Index(out, "child: stored"):], "child: stored %d loaded %d found %d missing %d", &stored, &loaded, &found, &missing)
		require.NoError(t, err, out)
		t.Logf("child %d (%v): stored %d, loaded %d, found %d, missing %d", n, c.engine, stored, loaded, found, missing)
		assert.Positive(t, loaded, "seed %d child %d loaded nothing", seed, n)
		assert.Positive(t, stored, "seed %d child %d stored nothing", seed, n)
	}
	store, err := blockstore.Open(dir, blockstore.Options{})
	require.NoError(t, err)
	verifyClean(t, store, "default", fmt.Sprintf("seed %d", seed))
	assert.Empty(t, tempFiles(t, store, "default"))
}

// killPlan says how killStoringChildren kills: at least kills children,
// more until one died mid-store (and, with published, until a block was
// published), at most killsMax, each at a random moment up to maxWait
// after it started storing.
type killPlan struct {
	kills, killsMax int
	maxWait         time.Duration
	published       bool
}

// anyBlock reports whether namespace ns of store holds a block.
func anyBlock(t *testing.T, store *blockstore.Store, ns string) bool {
	t.Helper()
	found := errors.New("found")
	err := store.Scan(ns, func(blockstore.BlockInfo) error { return found })
	if err != found {
		require.NoError(t, err)
	}
	return err == found
}

// killStoringChildren starts children storing into dir with engine kind and
// SIGKILLs them as plan says, until store's namespace ns holds a temporary
// file of one that died mid-store. It returns how many it killed.
func killStoringChildren(t *testing.T, plan killPlan, dir string, kind tier.EngineKind, rng *rand.Rand, seed uint64, store *blockstore.Store, ns string) int {
	t.Helper()
	n := 0
	for ; n < plan.killsMax && (n < plan.kills || len(tempFiles(t, store, ns)) == 0 || plan.published && !anyBlock(t, store, ns)); n++ {
		cmd, err := childCommand("crash", dir, kind, rng.Uint64())
		require.NoError(t, err)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != storingLine {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("seed %d kill %d: the child did not start storing (%q, %v): %s", seed, n, line, err, stderr.String())
		}
		time.Sleep(time.Duration(rng.IntN(int(plan.maxWait/time.Microsecond))) * time.Microsecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		err = cmd.Wait()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "seed %d kill %d: %v: %s", seed, n, err, stderr.String())
		status := exit.Sys().(syscall.WaitStatus)
		require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL,
			"seed %d kill %d: the child ended by itself (%v): %s", seed, n, err, stderr.String())
	}
	return n
}
