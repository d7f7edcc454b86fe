package noring

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Offsets into struct seccomp_data, the input of a seccomp filter: int nr; __u32 arch;
// __u64 instruction_pointer; __u64 args[6]. Source: include/uapi/linux/seccomp.h.
const (
	seccompDataNrOffset   = 0
	seccompDataArchOffset = 4
)

// auditArch is the AUDIT_ARCH_* value (include/uapi/linux/audit.h) the kernel puts in
// seccomp_data.arch for a native system call of this process, or 0 where this package has no
// filter for the architecture.
func auditArch() uint32 {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	return 0
}

// filterProgram returns a classic-BPF seccomp program that fails io_uring_setup, io_uring_enter and
// io_uring_register with errno and allows everything else. System call numbers mean something only
// for one architecture, so the program compares them only for arch; a call made through another ABI
// is allowed, and so is an x32 call on amd64 (number | __X32_SYSCALL_BIT). Go makes neither. The io_uring numbers are 425-427 on every architecture (the
// unified table since Linux 5.1, include/uapi/asm-generic/unistd.h); unix has them per GOARCH.
func filterProgram(arch uint32, errno syscall.Errno) []unix.SockFilter {
	deny := uint32(unix.SECCOMP_RET_ERRNO) | uint32(errno)&unix.SECCOMP_RET_DATA
	// Jump offsets count instructions to skip after the jump (include/uapi/linux/filter.h).
	return []unix.SockFilter{
		/* 0 */ stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompDataArchOffset),
		/* 1 */ jumpEq(arch, 0, 4), // foreign ABI: to 6, allow
		/* 2 */ stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompDataNrOffset),
		/* 3 */ jumpEq(unix.SYS_IO_URING_SETUP, 3, 0), // to 7, deny
		/* 4 */ jumpEq(unix.SYS_IO_URING_ENTER, 2, 0),
		/* 5 */ jumpEq(unix.SYS_IO_URING_REGISTER, 1, 0),
		/* 6 */ stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW),
		/* 7 */ stmt(unix.BPF_RET|unix.BPF_K, deny),
	}
}

// stmt is BPF_STMT from include/uapi/linux/filter.h.
func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

// jumpEq is BPF_JUMP(BPF_JMP|BPF_JEQ|BPF_K, k, jt, jf) from include/uapi/linux/filter.h.
func jumpEq(k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k, Jt: jt, Jf: jf}
}

// InstallFilter makes io_uring_setup, io_uring_enter and io_uring_register fail with errno on every
// thread of this process, now and later, for the rest of its life. It sets no_new_privs, which a
// filter needs without CAP_SYS_ADMIN, and which cannot be undone either: call it only in a process
// that exists to be tested, such as a child started by Run. It checks the result with a direct
// io_uring_setup call.
func InstallFilter(errno syscall.Errno) error {
	arch := auditArch()
	if arch == 0 {
		return fmt.Errorf("noring: no seccomp filter for GOARCH=%s (only amd64 and arm64)", runtime.GOARCH)
	}
	prog := filterProgram(arch, errno)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}

	// no_new_privs is per thread until TSYNC copies it to the others, so both calls must be made
	// by the same thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("noring: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if e != 0 {
		return fmt.Errorf("noring: seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): %w", e)
	}
	if r != 0 {
		// With TSYNC, a positive result is the ID of a thread that could not take the filter
		// (it has a filter of its own, unrelated to ours).
		return fmt.Errorf("noring: seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): thread %d could not be synchronized", r)
	}
	return checkSetup(errno, "seccomp filter installed")
}

// checkSetup makes an io_uring_setup call that the kernel itself would refuse (params NULL: EFAULT;
// entries 0: EINVAL), so that errno can only come from whatever refuses io_uring before that.
func checkSetup(errno syscall.Errno, what string) error {
	if _, _, got := unix.Syscall(unix.SYS_IO_URING_SETUP, 0, 0, 0); got != errno {
		return fmt.Errorf("noring: %s, but io_uring_setup answers %s (%v), not %s", what, unix.ErrnoName(got), got, unix.ErrnoName(errno))
	}
	return nil
}

// InstallFilterFromEnv makes this process the io_uring-less child that Run asked for, and does
// nothing in any other process. Call it first thing in TestMain. In ModeENOSYS and ModeEPERM it
// calls InstallFilter; in ModeSysctl it checks that the sysctl reads 2 and that io_uring_setup
// fails with EPERM. It then prints the line by
// which Run knows that the child is set up, and returns nil. An error means the child cannot do its
// job: print it and exit non-zero, so that Run fails.
func InstallFilterFromEnv() error {
	v, set := os.LookupEnv(EnvVar)
	if !set {
		return nil
	}
	mode, err := ParseMode(v)
	if err != nil {
		return err
	}
	switch mode {
	case ModeENOSYS, ModeEPERM:
		if err := InstallFilter(mode.Errno()); err != nil {
			return err
		}
	case ModeSysctl:
		b, err := os.ReadFile(sysctlPath)
		if err != nil {
			return fmt.Errorf("noring: %w", err)
		}
		if got := strings.TrimSpace(string(b)); got != "2" {
			return fmt.Errorf("noring: %s is %q in the child, want 2", sysctlPath, got)
		}
		if err := checkSetup(mode.Errno(), sysctlPath+" is 2"); err != nil {
			return err
		}
	}
	fmt.Println(readyLine(mode))
	return nil
}

// readyLine is what a child prints once io_uring is off, and what Run looks for.
func readyLine(mode Mode) string {
	return "noring: child ready: mode=" + mode.String() + ": io_uring_setup fails with " + unix.ErrnoName(mode.Errno())
}
