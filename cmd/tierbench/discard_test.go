package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/internal/mountinfo"
)

// mountinfo lines as Linux 6.18 lists them: ext4's discard is a superblock
// option, shown after the separator; a mount option is shown before it.
const testMountinfo = `22 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict
30 22 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,inode64
41 22 7:0 / /mnt/nd rw,relatime - ext4 /dev/loop0 rw,nodiscard
42 22 7:1 / /mnt/fast rw,relatime,discard - xfs /dev/loop1 rw,attr2
43 22 7:2 / /mnt/odd rw,relatime - ext4 /dev/loop2
44 22 0:40 / /mnt/b rw,relatime - btrfs /dev/loop3 rw,ssd,discard=async,space_cache=v2
`

func TestDiscardOn(t *testing.T) {
	ms, err := mountinfo.Parse(strings.NewReader(testMountinfo))
	require.NoError(t, err)
	for _, c := range []struct {
		dev, source string
		discard     bool
	}{
		{"254:0", "/dev/vda", true},  // superblock option
		{"7:0", "/dev/loop0", false}, // nodiscard is not discard
		{"7:1", "/dev/loop1", true},  // mount option
		{"0:26", "tmpfs", false},     // optional fields before the separator
		{"7:2", "/dev/loop2", false}, // no superblock options
		{"0:40", "/dev/loop3", true}, // btrfs's discard=async
	} {
		src, on, err := discardOn(ms, c.dev)
		require.NoError(t, err, c.dev)
		assert.Equal(t, c.source, src, c.dev)
		assert.Equal(t, c.discard, on, c.dev)
	}
	_, _, err = discardOn(ms, "8:1")
	assert.ErrorContains(t, err, "device 8:1 not in mountinfo")
}

// TestExt4NoJournal reads a sysfs tree: the device's name from
// dev/block, then its ext4 journal_task.
func TestExt4NoJournal(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev/block"), 0o755))
	for dev, name := range map[string]string{"7:1": "loop1", "7:2": "loop2", "254:0": "vda", "8:0": "sda"} {
		require.NoError(t, os.Symlink("../../devices/virtual/block/"+name, filepath.Join(root, "dev/block", dev)))
	}
	for name, task := range map[string]string{"loop1": "<none>\n", "loop2": "1234\n", "vda": "<none>\n"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, "fs/ext4", name), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "fs/ext4", name, "journal_task"), []byte(task), 0o644))
	}
	assert.True(t, ext4NoJournal(root, "7:1"))
	assert.True(t, ext4NoJournal(root, "254:0"))
	assert.False(t, ext4NoJournal(root, "7:2"), "a journal")
	assert.False(t, ext4NoJournal(root, "8:0"), "not ext4")
	assert.False(t, ext4NoJournal(root, "9:9"), "no such device")
}

// TestDiscardNote: a store run whose data set is on an ext4 mounted with
// discard says so under its table, and on an ext4 without a journal says
// that; mounted nodiscard with a journal, it says neither.
func TestDiscardNote(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to attach a loop device and mount it")
	}
	for _, tool := range []string{"mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	sh := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		require.NoError(t, err, "%s %v: %s", name, args, out)
		return strings.TrimSpace(string(out))
	}
	loop := func(mkfs ...string) string { // a fresh ext4 image of mkfs's options, on a loop device
		img := filepath.Join(t.TempDir(), "ext4.img")
		require.NoError(t, os.WriteFile(img, nil, 0o600))
		require.NoError(t, os.Truncate(img, 64<<20))
		sh("mkfs.ext4", append([]string{"-q", "-F"}, append(mkfs, img)...)...)
		dev := sh("losetup", "--find", "--show", img)
		t.Cleanup(func() { exec.Command("losetup", "--detach", dev).Run() })
		return dev
	}
	journal, none := loop(), loop("-O", "^has_journal")
	for _, c := range []struct{ name, dev, opt string }{
		{"discard", journal, "discard"}, {"nodiscard", journal, "nodiscard"}, {"nojournal", none, "nodiscard"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, unix.Mount(c.dev, dir, "ext4", 0, c.opt))
			t.Cleanup(func() { unix.Unmount(dir, 0) })
			mustRun(t, append([]string{"populate", "--dir", dir}, tiny[:4]...)...)
			out := mustRun(t, append([]string{"store", "--dir", dir, "--engine", "sync"}, tinyWorkload...)...)
			if c.opt == "discard" {
				assert.Regexp(t, `(?m)^\S+ is on `+regexp.QuoteMeta(c.dev)+`, mounted with discard: `, out)
			} else {
				assert.NotContains(t, out, "mounted with discard", out)
			}
			if c.dev == none {
				assert.Regexp(t, `(?m)^\S+ is on `+regexp.QuoteMeta(c.dev)+`, an ext4 without a journal: `, out)
			} else {
				assert.NotContains(t, out, "without a journal", out)
			}
		})
	}
}
