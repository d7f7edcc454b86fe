// Package mountinfo reads the kernel's list of this process's mounts,
// /proc/self/mountinfo (proc(5)).
package mountinfo

import (
	"bufio"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Mount is one line: id parent major:minor root mountpoint options
// [optional...] - fstype source superopts.
type Mount struct {
	Dev          string   // the filesystem's device, "major:minor"
	Point        string   // where it is mounted, unescaped
	Options      []string // the mount's options
	FSType       string
	Source       string
	SuperOptions []string // the filesystem's (superblock) options
}

// Read returns the mounts of /proc/self/mountinfo, in its order: a mount
// on top of another comes after it.
func Read() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads a mountinfo listing; it skips lines it cannot read.
func Parse(r io.Reader) ([]Mount, error) {
	var ms []Mount
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || sep+2 >= len(fields) {
			continue
		}
		m := Mount{
			Dev:     fields[2],
			Point:   unescape(fields[4]),
			Options: strings.Split(fields[5], ","),
			FSType:  fields[sep+1],
			Source:  unescape(fields[sep+2]),
		}
		if sep+3 < len(fields) {
			m.SuperOptions = strings.Split(fields[sep+3], ",")
		}
		ms = append(ms, m)
	}
	return ms, sc.Err()
}

// unescape undoes the octal escapes (\040 for space, etc.) of path fields.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
