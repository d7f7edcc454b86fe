package linux_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/linux_test/noring"
	"github.com/uringtier/uringtier/tier"
	"github.com/uringtier/uringtier/uring"
)

func TestMain(m *testing.M) {
	// In a child started by noring.Run, io_uring must be off before any test runs.
	if err := noring.InstallFilterFromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// A child started by TestCrashes or TestSeveralProcesses plays its role instead of testing.
	if dir := os.Getenv(leaseChildEnv); dir != "" {
		leaseChild(dir)
	}
	if code, ok := runChildRole(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// ioURingDisabledSysctl is the kernel's io_uring switch (Linux 6.6+).
const ioURingDisabledSysctl = "/proc/sys/kernel/io_uring_disabled"

// noIOURingChecked is printed by a child of TestNoIOURing after its last assertion passed.
const noIOURingChecked = "linux_test: no io_uring checked in mode "

// TestNoIOURing re-runs itself without io_uring in each noring mode. The child checks that uring
// reports io_uring unavailable with the errno and the advice for that cause, that tier.Open with
// EngineAuto falls back to the sync engine naming that cause while EngineURing fails with the same
// advice, and that plain file IO still works; the parent checks that the child got that far and that the sysctl was restored.
func TestNoIOURing(t *testing.T) {
	for _, tc := range []struct {
		mode    noring.Mode
		reason  string // the message names the cause
		unusual string // and not this other cause
	}{
		{mode: noring.ModeENOSYS, reason: "the kernel is older", unusual: "io_uring_disabled"},
		{mode: noring.ModeEPERM, reason: "seccomp", unusual: "io_uring_disabled"},
		{mode: noring.ModeSysctl, reason: "kernel.io_uring_disabled=2", unusual: "seccomp"},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			if mode, ok := noring.InChild(); ok {
				require.Equal(t, tc.mode, mode, "child started in another mode")
				checkUnavailable(t, "uring.Available", uring.Available(), mode.Errno(), tc.reason, tc.unusual)
				r, err := uring.New(8, uring.Options{})
				require.Nil(t, r)
				checkUnavailable(t, "uring.New", err, mode.Errno(), tc.reason, tc.unusual)

				// The tier: EngineAuto falls back to sync and says why; asking for io_uring fails, saying
				// what to do.
				t.Setenv(tier.EngineEnv, "")
				tr, err := tier.Open(t.TempDir(), tier.Options{BlockSize: 4096})
				require.NoError(t, err)
				info := tr.Engine()
				require.NoError(t, tr.Close(context.Background()))
				require.Equal(t, tier.EngineSync, info.Kind, "EngineAuto without io_uring")
				require.Contains(t, info.Fallback, tc.reason, "Engine().Fallback")
				require.NotContains(t, info.Fallback, tc.unusual, "Engine().Fallback")
				tr, err = tier.Open(t.TempDir(), tier.Options{BlockSize: 4096, Engine: tier.EngineURing})
				require.Nil(t, tr)
				checkUnavailable(t, "tier.Open(EngineURing)", err, mode.Errno(), tc.reason, tc.unusual)

				path := filepath.Join(t.TempDir(), "block")
				want := []byte("written without io_uring")
				require.NoError(t, os.WriteFile(path, want, 0o600))
				got, err := os.ReadFile(path)
				require.NoError(t, err)
				require.Equal(t, want, got)

				fmt.Println(noIOURingChecked + mode.String())
				return
			}

			before, beforeErr := os.ReadFile(ioURingDisabledSysctl)
			out := noring.Run(t, tc.mode, t.Name())
			require.Contains(t, out, noIOURingChecked+tc.mode.String(), "the child did not reach its last assertion")
			if beforeErr == nil {
				after, err := os.ReadFile(ioURingDisabledSysctl)
				require.NoError(t, err)
				require.Equal(t, string(before), string(after), "%s not restored", ioURingDisabledSysctl)
			}
		})
	}
}

// checkUnavailable asserts that err, returned by op (of uring, or tier.Open), is an *uring.UnavailableError for errno
// whose message names reason and not unusual.
func checkUnavailable(t *testing.T, op string, err error, errno syscall.Errno, reason, unusual string) {
	t.Helper()
	require.Error(t, err, "%s succeeded without io_uring", op)
	var ue *uring.UnavailableError
	require.True(t, errors.As(err, &ue), "%s: %T is not *uring.UnavailableError: %v", op, err, err)
	require.ErrorIs(t, err, uring.ErrUnavailable, "%s", op)
	require.ErrorIs(t, err, errno, "%s", op)
	require.Contains(t, err.Error(), reason, "%s", op)
	require.NotContains(t, err.Error(), unusual, "%s", op)
	require.True(t, strings.Contains(err.Error(), "sync engine"), "%s: the message should say what to do: %v", op, err)
	t.Logf("%s: %v", op, err)
}
