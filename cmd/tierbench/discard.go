package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// discardMount reports whether dir's filesystem is mounted with the
// discard option, and its source (the device): found by dir's device
// number in /proc/self/mountinfo.
func discardMount(dir string) (source string, discard bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	return discardIn(f, fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
}

// discardIn looks in a mountinfo listing for the filesystem of device dev
// ("major:minor") and whether its mount or superblock options say discard.
func discardIn(r io.Reader, dev string) (source string, discard bool, err error) {
	sc := bufio.NewScanner(r)
	found := false
	for sc.Scan() {
		// proc(5): id parent major:minor root mountpoint options [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || sep+2 >= len(fields) || fields[2] != dev {
			continue
		}
		found = true
		source = fields[sep+2]
		opts := strings.Split(fields[5], ",")
		if sep+3 < len(fields) {
			opts = append(opts, strings.Split(fields[sep+3], ",")...)
		}
		if slices.ContainsFunc(opts, func(o string) bool { return o == "discard" || strings.HasPrefix(o, "discard=") }) {
			return source, true, sc.Err() // btrfs says discard=async
		}
	}
	if err := sc.Err(); err != nil {
		return "", false, err
	}
	if !found {
		return "", false, fmt.Errorf("device %s not in mountinfo", dev)
	}
	return source, false, nil
}

// noteDiscard notes when the data set's filesystem is mounted with
// discard: deleting blocks then sends the device TRIMs, and store runs
// after deletes slow down one after another (README, on store figures).
func (s *session) noteDiscard() {
	if src, on, err := discardMount(s.backing); err == nil && on {
		s.note("%s is on %s, mounted with discard: deletes send the device TRIMs, and store figures fall from run to run after them; for store figures that compare, use a filesystem mounted nodiscard", s.backing, src)
	}
}
