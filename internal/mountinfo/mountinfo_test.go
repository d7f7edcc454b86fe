package mountinfo

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	const listing = `22 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict
30 22 0:26 / /dev/shm rw,nosuid,nodev shared:4 master:1 - tmpfs tmpfs rw,inode64
43 22 0:52 / /tmp/a\040b rw - fuse.faultfs faultfs
not a mount line
`
	ms, err := Parse(strings.NewReader(listing))
	require.NoError(t, err)
	assert.Equal(t, []Mount{
		{Dev: "254:0", Point: "/", Options: []string{"rw", "relatime"}, FSType: "ext4", Source: "/dev/vda",
			SuperOptions: []string{"rw", "discard", "resv_strict"}},
		// Optional fields before the separator.
		{Dev: "0:26", Point: "/dev/shm", Options: []string{"rw", "nosuid", "nodev"}, FSType: "tmpfs", Source: "tmpfs",
			SuperOptions: []string{"rw", "inode64"}},
		// An escaped space; no superblock options.
		{Dev: "0:52", Point: "/tmp/a b", Options: []string{"rw"}, FSType: "fuse.faultfs", Source: "faultfs"},
	}, ms)
}

// TestRead finds the root filesystem among this process's mounts.
func TestRead(t *testing.T) {
	ms, err := Read()
	require.NoError(t, err)
	var points []string
	for _, m := range ms {
		points = append(points, m.Point)
	}
	assert.Contains(t, points, "/")
}
