// Package noring re-runs the current test binary in a child process in which io_uring cannot be used,
// so that tests can check what the code does on a machine without it: an old kernel, a container
// whose seccomp profile blocks io_uring, or a host that switched it off by sysctl.
//
// A test that wants a child without io_uring calls Run with a Mode and the name of the test the child
// should run (often its own, t.Name()); the child finds out with InChild that it is the child:
//
//	func TestMain(m *testing.M) {
//		if err := noring.InstallFilterFromEnv(); err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			os.Exit(2)
//		}
//		os.Exit(m.Run())
//	}
//
//	func TestFallback(t *testing.T) {
//		if mode, ok := noring.InChild(); ok {
//			// io_uring_setup fails here with mode.Errno(); assert what the code does about it.
//			return
//		}
//		out := noring.Run(t, noring.ModeEPERM, t.Name())
//		// out is the child's -test.v output.
//	}
//
// # Modes
//
// ModeENOSYS and ModeEPERM install a seccomp-BPF filter in the child that makes io_uring_setup,
// io_uring_enter and io_uring_register fail with ENOSYS (what an old kernel, or a profile that hides
// the calls, answers) or EPERM (what Docker's default profile answers), and allows every other
// system call. The filter is installed by InstallFilterFromEnv, which the child's TestMain calls
// before any test runs, with SECCOMP_FILTER_FLAG_TSYNC so that every thread the Go runtime has
// started gets it and every later thread inherits it. Nothing in the child may use io_uring before
// TestMain (no package init may create a ring). The filter lives and dies with the child process.
//
// ModeSysctl writes 2 to /proc/sys/kernel/io_uring_disabled for as long as the child runs and then
// writes back the previous value, also when the child fails or Run's test fails. This switches
// io_uring off for the whole machine, not only for the child: any other process that creates a ring
// in that window fails. Run therefore holds a package-level mutex (tests of one binary take turns)
// and an exclusive flock on a lock file under /run (test binaries take turns, so that two of them
// cannot save each other's "2" as the value to restore). io_uring tests in other packages take
// neither, so do not run them at the same moment as a ModeSysctl test; the window is as short as the
// child's test. The lock file records the value to restore while the sysctl is changed: if a test
// binary dies before restoring it (SIGKILL, a test timeout), the next ModeSysctl run restores that
// value first. /run is emptied at boot, which is when the sysctl returns to its boot value too.
//
// # Proof that the child ran
//
// Run fails the calling test when the child exits non-zero, when the named test did not run and
// pass in the child (a misspelt name would otherwise pass: "no tests to run"), and when the child
// did not report from InstallFilterFromEnv that io_uring is off in the requested mode (a binary
// without that TestMain would otherwise run the child with io_uring available). A child test that
// skips makes Run skip the calling test with the child's output.
package noring
