package main

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/internal/mountinfo"
)

// discardMount reports whether dir's filesystem is mounted with the
// discard option, and its source (the device): found by dir's device
// number among this process's mounts.
func discardMount(dir string) (source string, discard bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", false, err
	}
	ms, err := mountinfo.Read()
	if err != nil {
		return "", false, err
	}
	return discardOn(ms, fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
}

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

// noteDiscard notes when the data set's filesystem is mounted with
// discard: deleting blocks then sends the device TRIMs, and store runs
// after deletes slow down one after another (docs/performance.md).
func (s *session) noteDiscard() {
	if src, on, err := discardMount(s.backing); err == nil && on {
		s.note("%s is on %s, mounted with discard: deletes send the device TRIMs, and store figures fall from run to run after them; for store figures that compare, use a filesystem mounted nodiscard", s.backing, src)
	}
}
