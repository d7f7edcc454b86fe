package faultfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/internal/mountinfo"
)

// ErrUnmounted is returned by Inject after Unmount.
var ErrUnmounted = errors.New("faultfs: unmounted")

// Options configures a mount. The zero value is what fault tests want: nothing cached by the kernel.
type Options struct {
	// EntryTimeout is how long the kernel may cache a name lookup (and a failed one). Zero makes every
	// path walk send LOOKUP, so lookup faults apply every time.
	EntryTimeout time.Duration
	// AttrTimeout is how long the kernel may cache attributes. Zero makes every stat send GETATTR or
	// STATX, so getattr faults apply every time.
	AttrTimeout time.Duration
	// PageCache lets the kernel cache file data. Off (the default), files are opened with
	// FOPEN_DIRECT_IO, so every read and write reaches the filesystem and its faults.
	PageCache bool
	// UnmountTimeout bounds how long Unmount waits for the FUSE server to stop after the mount is gone.
	// Zero means 10 seconds.
	UnmountTimeout time.Duration
}

// FS is a mounted fault-injecting pass-through filesystem. Its methods are safe for concurrent use.
type FS struct {
	mountpoint string  // absolute, set by Mount
	backing    string  // absolute, set by Mount
	opts       Options // set by Mount, read-only afterwards

	server     *fuse.Server  // set by Mount; its Serve loop runs on a goroutine that closes served
	served     chan struct{} // closed when Serve has returned
	connID     string        // fusectl connection number ("" if unknown), set by Mount
	done       chan struct{} // closed at the start of Unmount: wakes every fault and disables them
	hung       atomic.Int64  // operations held by all rules right now
	unmounted  sync.Once     // guards unmountErr
	unmountErr error         // result of the first Unmount

	mu    sync.Mutex              // serializes rule-list writers
	rules atomic.Pointer[[]*Rule] // copy-on-write list, read lock-free by every FUSE operation
}

// Available reports why FUSE cannot be used in this process (nil if it can), so tests can
// t.Skip(err.Error()).
func Available() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("faultfs: FUSE unavailable: %w", err)
	}
	f.Close()
	if os.Geteuid() != 0 {
		return fmt.Errorf("faultfs: FUSE tests need root (euid is %d)", os.Geteuid())
	}
	// As root, Mount calls mount(2) itself (DirectMountStrict): fusermount3 is not needed.
	return nil
}

func fusermount() (string, error) {
	if p, err := exec.LookPath("fusermount3"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/bin/fusermount3"); err == nil {
		return "/bin/fusermount3", nil
	}
	return "", exec.ErrNotFound
}

// Mount mounts a pass-through view of the directory backing on mountpoint (an existing directory) and
// serves it until Unmount. Faults are added with Inject.
func Mount(mountpoint, backing string, opts Options) (*FS, error) {
	if opts.EntryTimeout < 0 || opts.AttrTimeout < 0 || opts.UnmountTimeout < 0 {
		return nil, fmt.Errorf("faultfs: negative timeout in %+v", opts)
	}
	if opts.UnmountTimeout == 0 {
		opts.UnmountTimeout = 10 * time.Second
	}
	var err error
	if backing, err = absDir(backing); err != nil {
		return nil, err
	}
	if mountpoint, err = absDir(mountpoint); err != nil {
		return nil, err
	}
	f := &FS{
		mountpoint: mountpoint,
		backing:    backing,
		opts:       opts,
		served:     make(chan struct{}),
		done:       make(chan struct{}),
	}
	f.rules.Store(&[]*Rule{})

	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: backing, Err: err}
	}
	rootData := &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	root := &node{LoopbackNode: &fs.LoopbackNode{RootData: rootData}, fs: f}
	rootData.RootNode = root

	entry, attr := opts.EntryTimeout, opts.AttrTimeout
	fsOpts := &fs.Options{
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &entry,
		MountOptions: fuse.MountOptions{
			FsName: backing,
			Name:   "faultfs",
			// READDIRPLUS would run LOOKUP faults for every entry of a listing.
			DisableReadDirPlus: true,
			// As root, mount(2) directly rather than through fusermount3, which then need not be
			// installed; unprivileged mounts still go through it.
			DirectMountStrict: os.Geteuid() == 0,
			// Libraries do not log; go-fuse would otherwise print to the standard logger, e.g. when a
			// reply to an aborted connection fails.
			Logger: log.New(io.Discard, "", 0),
		},
	}
	f.server, err = fuse.NewServer(fs.NewNodeFS(root, fsOpts), mountpoint, &fsOpts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("faultfs: mount %s on %s: %w", backing, mountpoint, err)
	}
	go func() {
		defer close(f.served)
		f.server.Serve()
	}()
	if err := f.server.WaitMount(); err != nil {
		f.Unmount()
		return nil, fmt.Errorf("faultfs: mount %s on %s: %w", backing, mountpoint, err)
	}
	// Found now, while nothing can hang, so that Unmount can abort the connection later.
	f.connID, _ = fuseConnID(mountpoint)
	return f, nil
}

func absDir(p string) (string, error) {
	p, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("faultfs: %w", err)
	}
	p, err = filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("faultfs: %w", err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("faultfs: %w", err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("faultfs: %s is not a directory", p)
	}
	return p, nil
}

// Mountpoint returns the absolute path the filesystem is mounted on.
func (f *FS) Mountpoint() string { return f.mountpoint }

// Backing returns the absolute path of the directory the filesystem passes through to.
func (f *FS) Backing() string { return f.backing }

// Inject installs a fault and returns its rule. Rules apply in the order they were installed: every
// matching rule fires (latencies add up, hangs wait in turn) until one fails the operation with its Errno.
func (f *FS) Inject(fault Fault) (*Rule, error) {
	if err := fault.validate(); err != nil {
		return nil, err
	}
	r := &Rule{fault: fault, fs: f, wake: make(chan struct{})}
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
		return nil, ErrUnmounted
	default:
	}
	old := *f.rules.Load()
	rules := make([]*Rule, len(old), len(old)+1)
	copy(rules, old)
	rules = append(rules, r)
	f.rules.Store(&rules)
	return r, nil
}

func (f *FS) removeRule(r *Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := *f.rules.Load()
	rules := make([]*Rule, 0, len(old))
	for _, o := range old {
		if o != r {
			rules = append(rules, o)
		}
	}
	f.rules.Store(&rules)
}

// Rules returns the installed rules in the order they apply.
func (f *FS) Rules() []*Rule {
	return append([]*Rule(nil), *f.rules.Load()...)
}

// Release releases every installed rule (see Rule.Release): all hung operations proceed.
func (f *FS) Release() {
	for _, r := range *f.rules.Load() {
		r.Release()
	}
}

// Reset removes every rule, releasing what they hold; the filesystem passes everything through again.
func (f *FS) Reset() {
	for _, r := range f.Rules() {
		r.Remove()
	}
}

// Hung returns how many operations are held by hanging rules right now.
func (f *FS) Hung() int { return int(f.hung.Load()) }

// inject runs the installed rules for one operation; see Inject.
func (f *FS) inject(ctx context.Context, op Op) syscall.Errno {
	select {
	case <-f.done:
		return 0
	default:
	}
	if c, ok := fuse.FromContext(ctx); ok {
		op.Tid = c.Pid
	}
	for _, r := range *f.rules.Load() {
		if !r.fault.matches(op) {
			continue
		}
		if errno := r.apply(ctx, f.done); errno != 0 {
			return errno
		}
	}
	return 0
}

// Unmount releases every hung operation, disables all faults, unmounts, and waits for the FUSE server to
// stop. If the mount is busy (a descriptor on it is still open) it is detached lazily and the FUSE
// connection aborted, so later use of those descriptors fails with ENOTCONN. Unmount is idempotent; it
// returns the first call's result.
func (f *FS) Unmount() error {
	f.unmounted.Do(func() { f.unmountErr = f.unmount() })
	return f.unmountErr
}

func (f *FS) unmount() error {
	f.mu.Lock()
	close(f.done)
	f.mu.Unlock()

	var umountErr error
	// Released operations need a moment to reply; until then the kernel may find the mount busy.
	for delay := time.Millisecond; delay < 100*time.Millisecond; delay *= 4 {
		if umountErr = f.umount(false); umountErr == nil {
			break
		}
		time.Sleep(delay)
	}
	aborted := false
	if umountErr != nil {
		if err := f.umount(true); err != nil {
			return fmt.Errorf("faultfs: unmount %s: %v; lazy unmount: %w", f.mountpoint, umountErr, err)
		}
		// A lazily detached mount lives on while descriptors are open, and so would the server.
		aborted = f.abort() == nil
	}
	timer := time.NewTimer(f.opts.UnmountTimeout)
	defer timer.Stop()
	select {
	case <-f.served:
		return nil
	case <-timer.C:
	}
	if !aborted {
		if err := f.abort(); err != nil {
			return fmt.Errorf("faultfs: unmount %s: server still running after %v and %w",
				f.mountpoint, f.opts.UnmountTimeout, err)
		}
		select {
		case <-f.served:
			return nil
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("faultfs: unmount %s: server still running after %v", f.mountpoint, f.opts.UnmountTimeout)
}

// umount detaches the mount, with umount2(2) as root and fusermount3 otherwise.
func (f *FS) umount(lazy bool) error {
	if os.Geteuid() == 0 {
		flags := 0
		if lazy {
			flags = unix.MNT_DETACH
		}
		if err := unix.Unmount(f.mountpoint, flags); err != nil {
			return &os.PathError{Op: "umount2", Path: f.mountpoint, Err: err}
		}
		return nil
	}
	bin, err := fusermount()
	if err != nil {
		return err
	}
	args := []string{"-u", f.mountpoint}
	if lazy {
		args = []string{"-u", "-z", f.mountpoint}
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// abort aborts the FUSE connection through fusectl: every pending and future request fails with
// ENOTCONN and the server's read of /dev/fuse returns ENODEV, which stops it.
func (f *FS) abort() error {
	if f.connID == "" {
		return errors.New("faultfs: FUSE connection number unknown, cannot abort")
	}
	p := filepath.Join("/sys/fs/fuse/connections", f.connID, "abort")
	if _, err := os.Stat(p); err == nil {
		return writeAbort(p)
	}
	// fusectl is not mounted on /sys/fs/fuse/connections (containers often lack it). It is a
	// single-instance filesystem, so a private mount of it on a temporary directory shows the same
	// connections, and leaves the system as it was once unmounted.
	dir, err := os.MkdirTemp("", "faultfs-fusectl-")
	if err != nil {
		return fmt.Errorf("faultfs: abort FUSE connection: %w", err)
	}
	defer os.Remove(dir)
	if err := unix.Mount("fusectl", dir, "fusectl", 0, ""); err != nil {
		return fmt.Errorf("faultfs: abort FUSE connection: mount fusectl on %s: %w", dir, err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	return writeAbort(filepath.Join(dir, f.connID, "abort"))
}

func writeAbort(p string) error {
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		return fmt.Errorf("faultfs: abort FUSE connection: %w", err)
	}
	return nil
}

// fuseConnID returns the fusectl connection number of the FUSE mount on mountpoint: the minor device
// number in /proc/self/mountinfo (anonymous devices have major 0, so minor is the whole dev_t the
// kernel names the directory after; see fs/fuse/control.c).
func fuseConnID(mountpoint string) (string, error) {
	ms, err := mountinfo.Read()
	if err != nil {
		return "", err
	}
	found := ""
	for _, m := range ms {
		if m.Point != mountpoint || !strings.HasPrefix(m.FSType, "fuse") {
			continue
		}
		major, minor, ok := strings.Cut(m.Dev, ":")
		if !ok || major != "0" {
			continue
		}
		if _, err := strconv.Atoi(minor); err != nil {
			continue
		}
		found = minor // the last one listed is the one on top
	}
	if found == "" {
		return "", fmt.Errorf("faultfs: no FUSE mount on %s in /proc/self/mountinfo", mountpoint)
	}
	return found, nil
}

// Mounted reports whether a FUSE filesystem is mounted on mountpoint, per /proc/self/mountinfo.
func Mounted(mountpoint string) bool {
	if p, err := filepath.Abs(mountpoint); err == nil {
		mountpoint = p
	}
	_, err := fuseConnID(mountpoint)
	return err == nil
}
