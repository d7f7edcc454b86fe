package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/tier"
)

// The Python package's tests (python/tests) and the C test (ctest/) run
// against a liburingtier.so that TestMain builds with go build
// -buildmode=c-shared. The library is built without -race even under
// go test -race: a shared library with the race runtime cannot be loaded
// by a program without it.
//
// A skipped Python test fails the run when CI is set: on CI every
// requirement (python3-numpy, root, /dev/fuse) is installed
// by .ci/run, so a skip means a test did not run that should have.

// built holds what TestMain built, in a directory it removes afterwards.
var built struct {
	dir        string // the temporary directory
	lib        string // liburingtier.so
	faultmount string // capi/internal/faultmount
	err        error  // why building failed
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "capi-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	built.dir = dir
	built.lib = filepath.Join(dir, "liburingtier.so")
	built.faultmount = filepath.Join(dir, "faultmount")
	built.err = goBuild("-buildmode=c-shared", "-o", built.lib, ".")
	if built.err == nil {
		built.err = goBuild("-o", built.faultmount, "./internal/faultmount")
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func goBuild(args ...string) error {
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// need fails t where CI is set and skips it elsewhere, for a missing
// requirement.
func need(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// python returns the interpreter the tests run under: $URINGTIER_PYTHON,
// else Debian's /usr/bin/python3 (a pyenv python3 first on PATH would not
// see Debian's python3-numpy).
func python() string {
	if p := os.Getenv("URINGTIER_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

var skipped = regexp.MustCompile(`(?m)^(.*) \.\.\. skipped (.*)$`)

func TestPython(t *testing.T) {
	require.NoError(t, built.err)
	py := python()
	_, err := os.Stat(py)
	need(t, err == nil, "no %s: %v", py, err)
	err = exec.Command(py, "-c", "import numpy").Run()
	need(t, err == nil, "%s cannot import numpy (Debian: apt-get install python3-numpy): %v", py, err)

	readback := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
	cmd.Dir = "../python"
	cmd.Env = append(os.Environ(),
		"URINGTIER_LIBRARY="+built.lib,
		"URINGTIER_FAULTMOUNT="+built.faultmount,
		"URINGTIER_READBACK_DIR="+readback,
		"PYTHONDONTWRITEBYTECODE=1",
		"PYTHONFAULTHANDLER=1",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s:\n%s", py, strings.Join(cmd.Args[1:], " "), out)
	require.NoError(t, err, "the Python tests failed (output above)")
	if m := skipped.FindAllSubmatch(out, -1); len(m) > 0 {
		var names []string
		for _, s := range m {
			names = append(names, fmt.Sprintf("%s: %s", s[1], s[2]))
		}
		need(t, false, "%d Python tests skipped:\n%s", len(m), strings.Join(names, "\n"))
	}
	require.Regexp(t, `(?m)^Ran [1-9][0-9]* tests? in`, string(out))

	t.Run("ReadBack", func(t *testing.T) { readBack(t, readback) })
}

// readBack loads, through the Go tier, the blocks that the Python test
// test_store_read_back_by_go stored, and checks their bytes.
func readBack(t *testing.T, root string) {
	for _, kind := range []tier.EngineKind{tier.EngineSync, tier.EngineURing} {
		ns := "readback-" + kind.String()
		_, err := os.Stat(filepath.Join(root, ns))
		require.NoError(t, err, "the Python test stored nothing with the %s engine", kind)
		tr, err := tier.Open(root, tier.Options{BlockSize: 4096, Namespace: ns, Engine: tier.EngineSync})
		require.NoError(t, err)
		keys := make([][]byte, 16)
		bufs := make([][]byte, 16)
		for i := range keys {
			k := sha256.Sum256(fmt.Appendf(nil, "readback-%d", i))
			keys[i], bufs[i] = k[:], make([]byte, 4096)
		}
		require.NoError(t, tr.Load(1, keys, bufs))
		res := make([]tier.Result, 1)
		deadline := time.Now().Add(10 * time.Second)
		for tr.Poll(res) == 0 {
			require.True(t, time.Now().Before(deadline), "no result")
			select {
			case <-tr.Ready():
			case <-time.After(10 * time.Millisecond):
			}
		}
		for i, k := range res[0].Keys {
			require.Equal(t, tier.StatusLoaded, k.Status, "%s key %d: %v", ns, i, k.Err)
			require.True(t, bytes.Equal(payload(i, 4096), bufs[i]), "%s key %d: wrong bytes", ns, i)
		}
		require.NoError(t, tr.Close(context.Background()))
	}
}

// payload is python/tests/support.py's payload(i, size).
func payload(i, size int) []byte {
	seed := sha256.Sum256(fmt.Appendf(nil, "payload-%d", i))
	return bytes.Repeat(seed[:], size/len(seed)+1)[:size]
}

func TestC(t *testing.T) {
	require.NoError(t, built.err)
	cc, err := exec.LookPath("cc")
	need(t, err == nil, "no C compiler: %v", err)
	exe := filepath.Join(built.dir, "ctest")
	build := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", exe, "ctest/ctest.c",
		"-I.", "-L"+built.dir, "-luringtier", "-Wl,-rpath,"+built.dir)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := exec.Command(exe, t.TempDir())
	out, err = run.CombinedOutput()
	t.Logf("ctest:\n%s", out)
	require.NoError(t, err, "the C test failed (output above)")
	require.Regexp(t, `(?m)^[1-9][0-9]* passed, 0 failed$`, string(out))
}
