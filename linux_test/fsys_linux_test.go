package linux_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Real filesystems for the tests: a small tmpfs, ext4 mounted noatime and XFS, each on a loop device
// of its own, and a GlusterFS volume with several client mounts. Every helper skips t with the
// package to install when a tool is missing (CI installs them all and fails on any skip), and
// undoes everything it set up in t.Cleanup, also when the test fails half-way.

// fsSeq makes volume and image names unique within the process; the pid makes them unique across
// test binaries running at once on a shared machine.
var fsSeq atomic.Int64

// needTool skips t when the program is not installed, naming the Debian package that has it.
func needTool(t *testing.T, program, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(program); err != nil {
		t.Skipf("needs %s (Debian package %s): %v", program, pkg, err)
	}
}

// run runs a command and fails t with its output if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := runErr(name, args...)
	require.NoError(t, err)
	return out
}

// runErr runs a command and returns its standard output, or an error with its combined output.
func runErr(name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// unmountLater unmounts dir when t ends: normally, and lazily (MNT_DETACH) if the filesystem is
// still busy, so that a failed test never leaves a mount behind.
func unmountLater(t *testing.T, dir string) {
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			require.NoError(t, unix.Unmount(dir, unix.MNT_DETACH), "unmount %s (plain unmount: %v)", dir, err)
		}
	})
}

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	needRoot(t, "mounting a tmpfs")
	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)), "mount a tmpfs on %s", dir)
	unmountLater(t, dir)
	return dir
}

// loopDevice attaches a sparse image of size bytes to a free loop device with the given logical
// sector size, and detaches it when t ends.
func loopDevice(t *testing.T, size int64, sectorSize int) string {
	t.Helper()
	needTool(t, "losetup", "mount")
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	dev := strings.TrimSpace(run(t, "losetup", "--find", "--show", "--sector-size", strconv.Itoa(sectorSize), img))
	t.Cleanup(func() { run(t, "losetup", "--detach", dev) })
	require.Equal(t, strconv.Itoa(sectorSize), strings.TrimSpace(run(t, "blockdev", "--getss", dev)), "logical sector size of %s", dev)
	return dev
}

// mountXFS makes an XFS filesystem with sectorSize-byte sectors (512 or 4096) on a loop device of
// that logical sector size, mounts it noatime on a fresh directory and returns the directory.
func mountXFS(t *testing.T, sectorSize int) string {
	t.Helper()
	needRoot(t, "mounting XFS on a loop device")
	needTool(t, "mkfs.xfs", "xfsprogs")
	dev := loopDevice(t, 320<<20, sectorSize) // mkfs.xfs refuses filesystems under 300 MiB
	run(t, "mkfs.xfs", "-q", "-f", "-s", "size="+strconv.Itoa(sectorSize), dev)
	dir := t.TempDir()
	require.NoError(t, unix.Mount(dev, dir, "xfs", unix.MS_NOATIME, ""), "mount XFS from %s on %s", dev, dir)
	unmountLater(t, dir)
	return dir
}

// mountExt4 makes ext4 on a 128 MiB loop device and mounts it noatime on a fresh directory.
func mountExt4(t *testing.T) string { return mountExt4Of(t, 128<<20) }

// mountExt4Of makes ext4 on a loop device of size bytes and mounts it noatime on a fresh
// directory.
func mountExt4Of(t *testing.T, size int64) string {
	t.Helper()
	needRoot(t, "mounting ext4 on a loop device")
	needTool(t, "mkfs.ext4", "e2fsprogs")
	dev := loopDevice(t, size, 512)
	run(t, "mkfs.ext4", "-q", "-F", dev)
	dir := t.TempDir()
	require.NoError(t, unix.Mount(dev, dir, "ext4", unix.MS_NOATIME, ""), "mount ext4 from %s on %s", dev, dir)
	unmountLater(t, dir)
	return dir
}

// gluster is a one-brick GlusterFS volume served by this machine's glusterd over TCP, mounted by
// several FUSE clients: each mount is its own glusterfs client process with its own caches, as on
// separate hosts.
type gluster struct {
	t       *testing.T // the test that made it; its cleanups report to it
	host    string     // the address the brick is served on (not loopback: glusterd refuses it)
	volume  string     // the volume's name, unique
	brick   string     // the brick directory, on the local filesystem
	Mounts  []string   // the client mount points
	started bool       // the volume is started (glusterd runs its brick)
}

// glusterCaching says whether the clients cache attributes, entries, misses and data (GlusterFS's
// defaults) or not at all (the kernel's caches off with the mount options attribute-timeout=0,
// entry-timeout=0, negative-timeout=0, and the client translators' caches off by volume options:
// every lookup is a round trip to the server).
type glusterCaching bool

const (
	glusterCacheOff glusterCaching = false
	glusterCacheOn  glusterCaching = true
)

// newGluster creates and starts a volume with one brick in a fresh directory and mounts it clients
// times. It skips t when GlusterFS is not installed or glusterd is not running (CI starts it; on a
// developer machine `glusterd` as root does). Everything is undone when t ends: the mounts
// unmounted (lazily if busy), the volume stopped and deleted.
func newGluster(t *testing.T, clients int, caching glusterCaching) *gluster {
	t.Helper()
	needRoot(t, "GlusterFS")
	needTool(t, "gluster", "glusterfs-server")
	needTool(t, "mount.glusterfs", "glusterfs-client")
	if _, err := runErr("gluster", "--mode=script", "pool", "list"); err != nil {
		t.Skipf("needs glusterd running (start it as root: glusterd): %v", err)
	}
	host, err := glusterHost()
	if err != nil {
		t.Skipf("GlusterFS needs a non-loopback address for its brick: %v", err)
	}
	g := &gluster{
		t:      t,
		host:   host,
		volume: fmt.Sprintf("uringtier-%d-%d", os.Getpid(), fsSeq.Add(1)),
		brick:  filepath.Join(t.TempDir(), "brick"),
	}
	require.NoError(t, os.Mkdir(g.brick, 0o755))
	t.Cleanup(g.destroy)
	g.cli(t, "volume", "create", g.volume, g.host+":"+g.brick, "force")
	if caching == glusterCacheOff {
		// The client's translators cache too: metadata (md-cache, "stat-prefetch"), small files
		// (quick-read), pages (io-cache), read-ahead and deferred opens. Off, every lookup, open
		// and read is a request to the brick.
		for _, opt := range []string{"performance.stat-prefetch", "performance.quick-read", "performance.io-cache",
			"performance.read-ahead", "performance.open-behind", "performance.readdir-ahead"} {
			g.cli(t, "volume", "set", g.volume, opt, "off")
		}
	}
	g.Start(t)
	for range clients {
		g.Mounts = append(g.Mounts, g.mount(t, caching))
	}
	return g
}

// glusterHost returns the first non-loopback IPv4 address of this machine: the brick's host.
func glusterHost() (string, error) {
	out, err := runErr("hostname", "-I")
	if err != nil {
		return "", err
	}
	for _, a := range strings.Fields(out) {
		if !strings.Contains(a, ":") && !strings.HasPrefix(a, "127.") {
			return a, nil
		}
	}
	return "", fmt.Errorf("hostname -I lists no non-loopback IPv4 address (%q)", strings.TrimSpace(out))
}

// cli runs a gluster command in script mode (no questions asked) and fails t if it fails.
func (g *gluster) cli(t *testing.T, args ...string) string {
	t.Helper()
	return run(t, "gluster", append([]string{"--mode=script"}, args...)...)
}

// mount mounts the volume on a fresh directory, as a new client.
func (g *gluster) mount(t *testing.T, caching glusterCaching) string {
	t.Helper()
	dir := t.TempDir()
	opts := "log-level=WARNING"
	if caching == glusterCacheOff {
		opts += ",attribute-timeout=0,entry-timeout=0,negative-timeout=0"
	}
	run(t, "mount", "-t", "glusterfs", "-o", opts, g.host+":/"+g.volume, dir)
	unmountLater(t, dir)
	// The mount helper returns once the client process has started; wait until it serves the volume.
	require.Eventually(t, func() bool {
		var st unix.Statfs_t
		return unix.Statfs(dir, &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC
	}, 30*time.Second, 10*time.Millisecond, "the GlusterFS mount on %s did not come up", dir)
	return dir
}

// Start starts the volume: glusterd spawns its brick process (again, after BrickPid's process
// was killed), and Start waits until every client mount has reconnected to it, which they do by
// themselves within seconds.
func (g *gluster) Start(t *testing.T) {
	t.Helper()
	// Right after a brick process died, glusterd may not have noticed: "start force" succeeds
	// and starts nothing. Again until the brick is online.
	require.Eventually(t, func() bool {
		if _, err := runErr("gluster", "--mode=script", "volume", "start", g.volume, "force"); err != nil {
			t.Logf("start the test volume: %v", err)
			return false
		}
		g.started = true
		pid, err := g.brickPid()
		return err == nil && syscall.Kill(pid, 0) == nil
	}, 60*time.Second, 200*time.Millisecond, "the brick of %s did not come online", g.volume)
	for _, m := range g.Mounts {
		// A name that is not there: ENOENT once the brick answers, ENOTCONN until then.
		probe := filepath.Join(m, fmt.Sprintf(".reconnect-probe.%d", fsSeq.Add(1)))
		require.Eventually(t, func() bool {
			return errors.Is(unix.Access(probe, unix.F_OK), unix.ENOENT)
		}, 60*time.Second, 20*time.Millisecond, "client %s did not reconnect to the brick", m)
	}
}

// BrickPid returns the pid of the brick process (glusterfsd) serving the volume.
func (g *gluster) BrickPid(t *testing.T) int {
	t.Helper()
	pid, err := g.brickPid()
	require.NoError(t, err)
	return pid
}

// brickPid returns the pid of the brick process that `gluster volume status` reports online.
func (g *gluster) brickPid() (int, error) {
	var status struct {
		Nodes []struct {
			Path   string `xml:"path"`
			Status int    `xml:"status"`
			Pid    int    `xml:"pid"`
		} `xml:"volStatus>volumes>volume>node"`
	}
	out, err := runErr("gluster", "--mode=script", "volume", "status", g.volume, "--xml")
	if err != nil {
		return 0, err
	}
	if err := xml.Unmarshal([]byte(out), &status); err != nil {
		return 0, fmt.Errorf("gluster volume status --xml: %w: %s", err, out)
	}
	for _, n := range status.Nodes {
		if n.Path == g.brick && n.Status == 1 && n.Pid > 0 {
			return n.Pid, nil
		}
	}
	return 0, fmt.Errorf("gluster volume status %s: the brick is not online: %s", g.volume, out)
}

// destroy stops and deletes the volume; the mounts are gone by then (their cleanups were
// registered later, so they ran first). A brick left stopped by a test (SIGSTOP) is continued first.
func (g *gluster) destroy() {
	if g.started {
		if pid, err := g.brickPid(); err == nil {
			syscall.Kill(pid, syscall.SIGCONT)
		}
		if _, err := runErr("gluster", "--mode=script", "volume", "stop", g.volume, "force"); err != nil {
			g.t.Errorf("stop the test volume: %v", err)
		}
	}
	if _, err := runErr("gluster", "--mode=script", "volume", "delete", g.volume); err != nil {
		g.t.Errorf("delete the test volume: %v", err)
	}
}
