package noring

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mode is how a child is kept from using io_uring.
type Mode int

const (
	// ModeENOSYS makes the io_uring system calls fail with ENOSYS, like a kernel without them.
	ModeENOSYS Mode = iota + 1
	// ModeEPERM makes the io_uring system calls fail with EPERM, like Docker's default seccomp profile.
	ModeEPERM
	// ModeSysctl sets kernel.io_uring_disabled=2 for the whole machine while the child runs.
	ModeSysctl
)

// Modes lists every Mode, for table-driven tests.
var Modes = []Mode{ModeENOSYS, ModeEPERM, ModeSysctl}

// EnvVar is the environment variable by which Run tells the child its Mode (Mode.String).
const EnvVar = "URINGTIER_NORING"

// String returns the name used in EnvVar: "ENOSYS", "EPERM" or "sysctl".
func (m Mode) String() string {
	switch m {
	case ModeENOSYS:
		return "ENOSYS"
	case ModeEPERM:
		return "EPERM"
	case ModeSysctl:
		return "sysctl"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Errno is what io_uring_setup fails with in the child. With the sysctl at 2 the kernel answers
// EPERM (io_uring/io_uring.c, io_uring_allowed).
func (m Mode) Errno() syscall.Errno {
	if m == ModeENOSYS {
		return syscall.ENOSYS
	}
	return syscall.EPERM
}

// ParseMode is the inverse of Mode.String.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("noring: %s=%q is not a mode (ENOSYS, EPERM or sysctl)", EnvVar, s)
}

// InChild reports whether this process is a child started by Run, and in which Mode.
func InChild() (Mode, bool) {
	m, err := ParseMode(os.Getenv(EnvVar))
	return m, err == nil
}

// Available says why Run cannot run a child in mode here, or returns nil if it can.
func Available(mode Mode) error {
	switch mode {
	case ModeENOSYS, ModeEPERM:
		if auditArch() == 0 {
			return fmt.Errorf("noring: no seccomp filter for this architecture (only amd64 and arm64)")
		}
		// PR_GET_SECCOMP is EINVAL without CONFIG_SECCOMP; SECCOMP_GET_ACTION_AVAIL (Linux 4.14)
		// says whether filters may return errors, and fails with ENOSYS without the seccomp call.
		if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
			return fmt.Errorf("noring: seccomp unsupported (kernel without CONFIG_SECCOMP): %w", err)
		}
		action := uint32(unix.SECCOMP_RET_ERRNO)
		_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
		switch e {
		case 0, unix.EINVAL: // EINVAL: older than 4.14, where filters can return errors all the same
		case unix.ENOSYS:
			return fmt.Errorf("noring: seccomp filters unsupported (no seccomp system call, or it is blocked): %w", e)
		default:
			return fmt.Errorf("noring: seccomp filters cannot return an errno here: %w", e)
		}
		return nil
	case ModeSysctl:
		if euid := os.Geteuid(); euid != 0 {
			return fmt.Errorf("noring: setting %s needs root (euid is %d)", sysctlPath, euid)
		}
		if _, err := os.Stat(sysctlPath); err != nil {
			return fmt.Errorf("noring: no kernel.io_uring_disabled sysctl (Linux 6.6+): %w", err)
		}
		f, err := os.OpenFile(sysctlPath, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("noring: cannot write the sysctl (read-only /proc/sys in a container?): %w", err)
		}
		f.Close()
		return nil
	}
	return fmt.Errorf("noring: unknown %v", mode)
}

// Run runs the test named testName (t.Name() style: "TestX" or "TestX/sub") in a child process of
// this test binary where io_uring is unavailable in the given mode, and returns the child's combined
// -test.v output. It skips t with the reason when Available(mode) fails or when the child's test
// skipped, and fails t when the child fails, when testName did not run and pass in it, or when the
// child did not report from InstallFilterFromEnv (see the package doc). The child is killed shortly
// before t's deadline, so that a ModeSysctl run still restores the sysctl. Run must not be called in
// a child.
func Run(t testing.TB, mode Mode, testName string) (output string) {
	t.Helper()
	if m, ok := InChild(); ok {
		t.Fatalf("noring: Run(%v, %q) called in a child that is already in mode %v", mode, testName, m)
		return ""
	}
	if err := Available(mode); err != nil {
		t.Skipf("cannot run %s without io_uring (%v): %v", testName, mode, err)
		return ""
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("noring: %v", err)
		return ""
	}

	ctx := context.Background()
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline.Add(-time.Until(deadline)/10))
			defer cancel()
		}
	}
	args := []string{"-test.run=" + runPattern(testName), "-test.v", "-test.count=1"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	// A race-enabled child would sleep a second before exiting (GORACE atexit_sleep_ms, default 1000).
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), EnvVar+"="+mode.String(), "GORACE="+gorace)
	cmd.WaitDelay = time.Second

	if mode == ModeSysctl {
		restore, err := disableSysctl(sysctlPath, sysctlLockPath)
		if err != nil {
			t.Fatalf("noring: %v", err)
			return ""
		}
		defer func() {
			if err := restore(); err != nil {
				t.Errorf("noring: %v", err)
			}
		}()
	}
	out, err := cmd.CombinedOutput()
	output = string(out)

	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		t.Fatalf("noring: child %s (%v) failed: %v\n%s", testName, mode, err, output)
		return output
	case err != nil:
		t.Fatalf("noring: running child %s (%v): %v\n%s", testName, mode, err, output)
		return output
	case !strings.Contains(output, readyLine(mode)):
		t.Fatalf("noring: child %s (%v) did not report %q: does its TestMain call noring.InstallFilterFromEnv?\n%s",
			testName, mode, readyLine(mode), output)
		return output
	case resultLine("SKIP", testName).MatchString(output):
		t.Skipf("child %s (%v) skipped:\n%s", testName, mode, output)
		return output
	case !resultLine("PASS", testName).MatchString(output):
		t.Fatalf("noring: test %s did not run in the child (%v): misspelt?\n%s", testName, mode, output)
		return output
	}
	t.Logf("child %s (%v):\n%s", testName, mode, output)
	return output
}

// runPattern turns a test name into a -test.run pattern that matches it and nothing else: each
// slash-separated element anchored and quoted.
func runPattern(testName string) string {
	parts := strings.Split(testName, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// resultLine matches the line -test.v prints when testName ends with result (PASS, FAIL, SKIP).
func resultLine(result, testName string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^\s*--- ` + result + `: ` + regexp.QuoteMeta(testName) + ` \(`)
}
