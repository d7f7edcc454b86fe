package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestStoreKeepsFree: a store workload on a 64 MiB tmpfs with --keep-free
// 0.5 stops early, without an error, once half the filesystem is in use,
// and says so under its table and in its JSON row (stopped); with
// --keep-free 0 a few seconds of the same stores fill it.
func TestStoreKeepsFree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	freeShare := func() float64 {
		var st unix.Statfs_t
		require.NoError(t, unix.Statfs(dir, &st))
		return float64(st.Bavail) / float64(st.Blocks)
	}
	mustRun(t, "populate", "--dir", dir, "--blocks", "16", "--block-size", "64KiB")
	store := []string{"store", "--dir", dir, "--engine", "sync", "--duration", "60s", "--batch", "1", "--depth", "1"}

	code, stdout, stderr := tierbench(t, append(store, "--keep-free", "0.5")...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stderr, "store stopped early")
	assert.Contains(t, stderr, "under --keep-free 0.5")
	assert.Regexp(t, `(?m)^sync store stopped early, its row counting [\d,]+ keys: .* free of .* on the filesystem of .*, under --keep-free 0\.5$`, stdout)
	free := freeShare()
	t.Logf("free after the stores: %.4f of the filesystem", free)
	assert.InDelta(t, 0.5, free, 0.01, "stores ran until half the filesystem was used, within a batch or two")
	assert.Greater(t, readManifestT(t, dir).Blocks, uint64(16+300), "the stores landed in the data set")

	// Without a reserve, 800 more of the same stores (56 MiB) fill the
	// filesystem (the rest end full: StatusFull, not errors).
	store[5], store[6] = "--keys", "800"
	code, stdout, stderr = tierbench(t, append(store, "--keep-free", "0")...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.NotContains(t, stderr, "stopped early")
	assert.NotContains(t, stdout, "stopped early")
	assert.Less(t, freeShare(), 0.02)

	// Under the reserve from the start: no key stored, and the row says why.
	code, stdout, stderr = tierbench(t, append(store, "--keep-free", "0.5", "--json")...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	var r result
	require.NoError(t, json.Unmarshal([]byte(jsonLines(t, stdout)[0]), &r))
	assert.Zero(t, r.Keys)
	assert.Contains(t, r.Stopped, "under --keep-free 0.5")
}

// TestSumStopped: the row summing --jobs says how many of them stopped
// early and why the first did, under the table as in JSON.
func TestSumStopped(t *testing.T) {
	why := "3 MiB free of 64 MiB on the filesystem of /d, under --keep-free 0.5"
	rs := []*result{
		{Engine: "sync", Workload: "store", Job: 0, Jobs: 3, Keys: 10},
		{Engine: "sync", Workload: "store", Job: 1, Jobs: 3, Keys: 4, Stopped: why},
		{Engine: "sync", Workload: "store", Job: 2, Jobs: 3, Keys: 5, Stopped: "other"},
	}
	sum := sumResults(rs)
	assert.Equal(t, "2 of 3 jobs; job 1: "+why, sum.Stopped)
	assert.Equal(t, "sync store stopped early, its row counting 19 keys: 2 of 3 jobs; job 1: "+why, stoppedLine(sum))
	assert.Empty(t, sumResults(rs[:1]).Stopped, "no job stopped")
}

// TestDFSpace: a filesystem whose reserve is a third of its blocks (as on
// our machines) is as full as df says, not fuller.
func TestDFSpace(t *testing.T) {
	st := unix.Statfs_t{Bsize: 4096, Blocks: 900, Bfree: 600, Bavail: 300} // 300 used, 300 reserved
	free, size := dfSpace(&st)
	assert.Equal(t, int64(300*4096), free)
	assert.Equal(t, int64(600*4096), size, "used plus available")
}
