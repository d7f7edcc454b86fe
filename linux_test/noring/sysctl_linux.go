package noring

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// sysctlPath is the kernel's io_uring switch (Linux 6.6+, Documentation/admin-guide/sysctl/kernel.rst).
// Tests of this package point it at a plain file.
var sysctlPath = "/proc/sys/kernel/io_uring_disabled"

// sysctlLockPath is the lock file that ModeSysctl runs of all test binaries take turns on, and the
// record of the value to restore while the sysctl is changed. It is under /run, which is emptied at
// boot, exactly when the sysctl returns to its boot value.
var sysctlLockPath = "/run/uringtier-noring-sysctl.lock"

// sysctlMu makes the ModeSysctl runs of one process take turns; the flock on sysctlLockPath does
// the same between processes (an flock held by one open file excludes other opens in the same
// process too, but the mutex makes the wait cheap and the order obvious).
var sysctlMu sync.Mutex

// disableSysctl writes 2 to the sysctl at path and returns the function that writes back what was
// there before; until then it holds sysctlMu and an exclusive flock on lockPath, whose content is the
// value to restore. If lockPath already holds a value, a previous run died before restoring it, so
// that value is restored first and is the one saved.
func disableSysctl(path, lockPath string) (restore func() error, err error) {
	sysctlMu.Lock()
	lock, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		sysctlMu.Unlock()
		return nil, err
	}
	unlock := func() {
		lock.Close() // releases the flock
		sysctlMu.Unlock()
	}
	if err := flock(lock); err != nil {
		unlock()
		return nil, err
	}
	prev, err := readTrimmed(lock)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("reading %s: %w", lockPath, err)
	}
	if prev != "" {
		// A run that died mid-way left its saved value: put it back before anything else.
		if err := writeSysctl(path, prev); err != nil {
			unlock()
			return nil, fmt.Errorf("restoring %s=%s left by an earlier run (recorded in %s): %w", path, prev, lockPath, err)
		}
	}
	if prev, err = readSysctl(path); err != nil {
		unlock()
		return nil, err
	}
	if err := record(lock, prev); err != nil {
		unlock()
		return nil, fmt.Errorf("recording %s=%s in %s: %w", path, prev, lockPath, err)
	}
	if err := writeSysctl(path, "2"); err != nil {
		err = fmt.Errorf("disabling io_uring: %w", err)
		if rerr := record(lock, ""); rerr != nil {
			err = fmt.Errorf("%w; clearing %s: %v", err, lockPath, rerr)
		}
		unlock()
		return nil, err
	}
	return func() error {
		defer unlock()
		if err := writeSysctl(path, prev); err != nil {
			// The record stays, so that the next run restores prev.
			return fmt.Errorf("restoring %s=%s: %w", path, prev, err)
		}
		if got, err := readSysctl(path); err != nil || got != prev {
			return fmt.Errorf("restoring %s=%s: reads back %q (%v)", path, prev, got, err)
		}
		if err := record(lock, ""); err != nil {
			return fmt.Errorf("clearing %s after restoring %s: %w", lockPath, path, err)
		}
		return nil
	}, nil
}

// flock takes an exclusive flock on f, waiting as long as it takes, retrying EINTR.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			if err != nil {
				return fmt.Errorf("flock %s: %w", f.Name(), err)
			}
			return nil
		}
	}
}

// record replaces the content of f with value and a newline (nothing if value is empty) and syncs it.
func record(f *os.File, value string) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if value != "" {
		if _, err := f.WriteAt([]byte(value+"\n"), 0); err != nil {
			return err
		}
	}
	return f.Sync()
}

func readTrimmed(f *os.File) (string, error) {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<10))
	return strings.TrimSpace(string(b)), err
}

func readSysctl(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// writeSysctl writes value to the sysctl at path, as `echo value > path` would.
func writeSysctl(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("writing %s=%s: %w", path, value, err)
	}
	return f.Close()
}
