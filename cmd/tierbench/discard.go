package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/internal/mountinfo"
)

// discardOn looks among mounts for the filesystem of device dev
// ("major:minor") and whether its mount or superblock options say discard.
func discardOn(ms []mountinfo.Mount, dev string) (source string, discard bool, err error) {
	isDiscard := func(o string) bool { return o == "discard" || strings.HasPrefix(o, "discard=") } // btrfs: discard=async
	found := false
	for _, m := range ms {
		if m.Dev != dev {
			continue
		}
		found, source = true, m.Source
		if slices.ContainsFunc(m.Options, isDiscard) || slices.ContainsFunc(m.SuperOptions, isDiscard) {
			return source, true, nil
		}
	}
	if !found {
		return "", false, fmt.Errorf("device %s not in mountinfo", dev)
	}
	return source, false, nil
}

// ext4NoJournal reports whether device dev ("major:minor") holds an ext4
// without a journal, by sysfs under root: the device's name is where
// dev/block/DEV links to, and fs/ext4/NAME/journal_task says "<none>".
func ext4NoJournal(root, dev string) bool {
	link, err := os.Readlink(filepath.Join(root, "dev/block", dev))
	if err != nil {
		return false
	}
	task, err := os.ReadFile(filepath.Join(root, "fs/ext4", filepath.Base(link), "journal_task"))
	return err == nil && strings.TrimSpace(string(task)) == "<none>"
}

// noteStoreMount notes what of the data set's filesystem makes store
// figures fall from run to run (docs/performance.md): mounted with discard,
// deleting blocks sends the device TRIMs that deletes wait for; an ext4
// without a journal has each new file's inode skip those freed in the last
// minutes, a scan whose cost grows with the deletes before it.
func (s *session) noteStoreMount() {
	var st unix.Stat_t
	if err := unix.Stat(s.backing, &st); err != nil {
		return
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	ms, err := mountinfo.Read()
	if err != nil {
		return
	}
	src, on, err := discardOn(ms, dev)
	if err != nil {
		return
	}
	if on {
		s.note("%s is on %s, mounted with discard: deletes send the device TRIMs, and store figures fall from run to run after them; for store figures that compare, use a filesystem mounted nodiscard", s.backing, src)
	}
	if ext4NoJournal("/sys", dev) {
		s.note("%s is on %s, an ext4 without a journal: a new file's inode skips those deleted in the last minutes, so after many deletes (a data set removed) a store costs up to several times the CPU, for minutes; for store figures that compare, use a filesystem with a journal", s.backing, src)
	}
}
