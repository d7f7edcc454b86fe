package faultfs

import (
	"context"
	"fmt"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// OpKind is a set of FUSE operation kinds; a Fault applies to every kind in its set.
type OpKind uint32

// Operation kinds. Each names the FUSE request the kernel sends, not the system call that caused it:
// one stat(2) may send LOOKUP for every path component and then GETATTR (or STATX) for the last one.
const (
	// OpLookup is a LOOKUP of one name in a directory; Op.Path is the name looked up.
	OpLookup OpKind = 1 << iota
	// OpGetattr is a GETATTR or STATX (stat, fstat, statx).
	OpGetattr
	// OpSetattr is a SETATTR (truncate, chmod, chown, utimes).
	OpSetattr
	// OpOpen is an OPEN of an existing file.
	OpOpen
	// OpCreate is a CREATE (open with O_CREAT of a new name) or a TMPFILE (O_TMPFILE; Op.Path is the directory).
	OpCreate
	// OpRead is a READ from an open file; Op.Offset and Op.Size say which bytes.
	OpRead
	// OpWrite is a WRITE to an open file; Op.Offset and Op.Size say which bytes.
	OpWrite
	// OpFsync is an FSYNC of an open file (fsync, fdatasync).
	OpFsync
	// OpFlush is a FLUSH, sent synchronously by every close(2) of a descriptor.
	OpFlush
	// OpRelease is a RELEASE, sent when the last descriptor of an open file goes away. The kernel does not
	// make close(2) wait for it, so a fault here is seen by nobody but the counters and Unmount.
	OpRelease
	// OpRename is a RENAME; Op.Path is the old name and Op.NewPath the new one.
	OpRename
	// OpUnlink is an UNLINK of a file.
	OpUnlink
	// OpMkdir is a MKDIR.
	OpMkdir
	// OpRmdir is an RMDIR.
	OpRmdir
	// OpReaddir is an OPENDIR: listing a directory (readdir, getdents). It fires once per listing, when the
	// directory is opened, not once per READDIR batch.
	OpReaddir
	// OpLink is a LINK (link, linkat, including linkat of an O_TMPFILE descriptor); Op.Path is the new name.
	OpLink
	// OpStatfs is a STATFS (statfs, df).
	OpStatfs

	// OpAll is every kind above.
	OpAll OpKind = 1<<iota - 1
)

var opNames = [...]string{
	"lookup", "getattr", "setattr", "open", "create", "read", "write", "fsync", "flush", "release",
	"rename", "unlink", "mkdir", "rmdir", "readdir", "link", "statfs",
}

// String returns the kind's name, or names joined by "|" for a set.
func (k OpKind) String() string {
	if k == OpAll {
		return "all"
	}
	var names []string
	for i, name := range opNames {
		if k&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if rest := k &^ OpAll; rest != 0 {
		names = append(names, fmt.Sprintf("0x%x", uint32(rest)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// Op is one operation the kernel asked of the filesystem, as a Fault's Filter sees it.
type Op struct {
	// Kind is exactly one OpKind bit.
	Kind OpKind
	// Path is the path relative to the mount root, slash-separated, "." for the root itself. For an open
	// file whose name was unlinked it is whatever go-fuse still knows (possibly a ".go-fuse.N/deleted"
	// placeholder).
	Path string
	// NewPath is the destination of an OpRename, empty otherwise.
	NewPath string
	// Offset is the file offset of an OpRead or OpWrite, 0 otherwise.
	Offset int64
	// Size is the byte count of an OpRead or OpWrite, 0 otherwise.
	Size int
	// Tid is the thread whose system call sent the request (the FUSE request header's pid), 0 where the
	// kernel sends it on no thread's behalf (a RELEASE after the last close).
	Tid uint32
}

// Fault describes what to do to the operations it matches: first sleep Latency, then, if Hang, wait until
// released, then fail with Errno if it is not zero. A Fault with none of the three only counts.
type Fault struct {
	// Ops is the set of kinds the fault applies to; it must not be empty.
	Ops OpKind
	// Path is a path.Match pattern matched against Op.Path (and Op.NewPath for a rename) and against each
	// of its parent directories, so "blocks" and "blocks/*" match everything under blocks, "*" matches
	// everything, and "*.tmp" matches a top-level name only. Empty matches every path.
	Path string
	// Filter, if not nil, is asked after Ops and Path matched; returning false lets the operation pass
	// untouched and uncounted (e.g. "only writes at offset 0"). It runs on the FUSE server's goroutines,
	// concurrently, and must not block.
	Filter func(Op) bool
	// Latency is added to every matching operation before it runs. Unmount cuts it short.
	Latency time.Duration
	// Hang holds every matching operation until Rule.Release, Rule.Remove, FS.Release, FS.Reset or
	// FS.Unmount.
	Hang bool
	// Interruptible makes a kernel interrupt (FUSE_INTERRUPT, sent when the blocked caller has a signal
	// pending) end the latency or hang at once with EINTR, like an NFS "intr" mount. By default
	// interrupts are ignored, like a hard NFS mount: the caller stays blocked until the fault ends (a
	// fatal signal still frees it; the kernel then abandons the request).
	Interruptible bool
	// Errno, if not zero, is what the matching operation returns instead of running (after any latency
	// or hang). The caller sees exactly this errno.
	Errno syscall.Errno
}

func (f Fault) validate() error {
	if f.Ops == 0 {
		return fmt.Errorf("faultfs: fault has no operation kinds (Ops is 0)")
	}
	if f.Ops&^OpAll != 0 {
		return fmt.Errorf("faultfs: fault has unknown operation kinds %v", f.Ops)
	}
	if _, err := path.Match(f.Path, ""); err != nil {
		return fmt.Errorf("faultfs: fault path pattern %q: %w", f.Path, err)
	}
	if f.Latency < 0 {
		return fmt.Errorf("faultfs: fault latency %v is negative", f.Latency)
	}
	return nil
}

func (f Fault) matches(op Op) bool {
	if f.Ops&op.Kind == 0 {
		return false
	}
	if !matchPath(f.Path, op.Path) && (op.NewPath == "" || !matchPath(f.Path, op.NewPath)) {
		return false
	}
	return f.Filter == nil || f.Filter(op)
}

// matchPath reports whether pattern matches p or one of its parent directories.
func matchPath(pattern, p string) bool {
	if pattern == "" {
		return true
	}
	for {
		if ok, _ := path.Match(pattern, p); ok {
			return true
		}
		if !strings.Contains(p, "/") {
			return false
		}
		p = path.Dir(p)
	}
}

// Rule is a Fault installed on a mounted FS. Its methods are safe for concurrent use.
type Rule struct {
	fault Fault // set at creation, read-only afterwards
	fs    *FS   // owner, set at creation

	fired atomic.Int64 // operations matched so far
	hung  atomic.Int64 // operations waiting in hang right now

	mu       sync.Mutex    // guards released and wake
	released bool          // set once by Release/Remove; the rule hangs nothing afterwards
	wake     chan struct{} // closed by Release; hung operations wait on it
}

// Fault returns the fault the rule was installed with.
func (r *Rule) Fault() Fault { return r.fault }

// Fired returns how many operations the rule has matched so far (counted when matched, before any
// latency or hang), so a test can assert that the fault reached the filesystem.
func (r *Rule) Fired() int64 { return r.fired.Load() }

// Hung returns how many operations the rule holds right now.
func (r *Rule) Hung() int { return int(r.hung.Load()) }

// Release wakes every operation the rule holds and stops it hanging new ones; woken operations go on
// as the fault says (fail with Errno if set, else run normally). Latency and Errno stay in force until
// Remove. To hang again, install a new rule. Release is idempotent.
func (r *Rule) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.released {
		r.released = true
		close(r.wake)
	}
}

// Remove uninstalls the rule and releases what it holds. Operations already matched finish as the fault
// says; new ones no longer match. Remove is idempotent.
func (r *Rule) Remove() {
	r.fs.removeRule(r)
	r.Release()
}

// apply runs the fault for one matched operation and returns the errno the operation must fail with
// (0: run it). done is closed by Unmount; ctx is cancelled when the kernel interrupts the request
// (go-fuse closes fuse.Context.Cancel on FUSE_INTERRUPT).
func (r *Rule) apply(ctx context.Context, done <-chan struct{}) syscall.Errno {
	r.fired.Add(1)
	var interrupted <-chan struct{} // nil: never ready
	if r.fault.Interruptible {
		interrupted = ctx.Done()
	}
	if d := r.fault.Latency; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-interrupted:
			t.Stop()
			return syscall.EINTR
		case <-done:
			t.Stop()
		}
	}
	if r.fault.Hang {
		r.mu.Lock()
		wake, released := r.wake, r.released
		if !released {
			// Counted under mu so that Release, which takes mu, never misses an operation that is about
			// to wait: either it sees released or Release closes the channel it waits on.
			r.hung.Add(1)
			r.fs.hung.Add(1)
		}
		r.mu.Unlock()
		if !released {
			var errno syscall.Errno
			select {
			case <-wake:
			case <-done:
			case <-interrupted:
				errno = syscall.EINTR
			}
			r.hung.Add(-1)
			r.fs.hung.Add(-1)
			if errno != 0 {
				return errno
			}
		}
	}
	return r.fault.Errno
}
