package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
)

// TestVLLMLayout: every subcommand on a vLLM directory, one rank's blocks
// of one group, raw, found by --model.
func TestVLLMLayout(t *testing.T) {
	dir := t.TempDir()
	vflags := []string{"--layout", "vllm", "--model", "org/m-1B", "--rank", "1", "--group", "2"}
	out := mustRun(t, args("populate", dir, []string{"--blocks", "40", "--block-size", "8KiB"}, vflags)...)
	v := blockstore.NewVLLM(defaultVLLMRunConfig("org/m-1B"), 1, 2, false)
	assert.Contains(t, out, "namespace "+v.Namespace())
	cfg, err := os.ReadFile(filepath.Join(dir, v.Base, "config.json"))
	require.NoError(t, err)
	assert.Equal(t, string(v.Config.ConfigJSON()), string(cfg), "populate writes the run config as vLLM does")
	for _, i := range []uint64{0, 39} {
		b, err := os.ReadFile(filepath.Join(dir, v.Namespace(), string(v.Layout().AppendPath(nil, keyOf(nil, 1, i)))))
		require.NoError(t, err, "block %d at vLLM's path", i)
		assert.Len(t, b, 8192, "raw: the payload alone")
	}

	for _, w := range []string{"lookup", "load", "store"} {
		out := mustRun(t, args(w, dir, tinyWorkload, vflags, []string{"--json", "--engine", "all", "--hit-ratio", "1"})...)
		lines := jsonLines(t, out)
		for i, e := range resultEngines(t, "all", lines, 1) {
			checkResultLine(t, lines[i], e, w, 96, 8, 1)
		}
	}
	_, err = os.Stat(filepath.Join(dir, "~quarantine"))
	assert.True(t, os.IsNotExist(err), "a vLLM directory got a quarantine: %v", err)

	out = mustRun(t, args("du", dir, vflags, []string{"--json"})...)
	var du struct {
		Blocks, Bytes int64
		Namespaces    []struct{ Namespace string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &du))
	total := int64(40 + 96 + 96) // populate, and the store workload on each engine
	assert.Equal(t, total, du.Blocks)
	assert.Equal(t, total*8192, du.Bytes, "raw blocks have no header")
	require.Len(t, du.Namespaces, 1)
	assert.Equal(t, v.Namespace(), du.Namespaces[0].Namespace)

	// verify judges raw blocks by the data set's size: truncate one.
	path := filepath.Join(dir, v.Namespace(), string(v.Layout().AppendPath(nil, keyOf(nil, 1, 3))))
	require.NoError(t, os.Truncate(path, 100))
	code, out, stderr := tierbench(t, args("verify", dir, vflags)...)
	assert.Equal(t, exitFailure, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Contains(t, out, "corrupt: "+path+": blockstore: corrupt block: file is 100 bytes, the block size is 8192")
	assert.Contains(t, mustRun(t, args("verify", dir, vflags, []string{"--repair"})...), "1 corrupt, 1 removed, 0 remain")
	assert.NoFileExists(t, path)
	// Without --model: every rank directory, given the block size.
	code, _, stderr = tierbench(t, "verify", "--dir", dir, "--layout", "vllm")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--block-size is needed")
	assert.Contains(t, mustRun(t, "verify", "--dir", dir, "--layout", "vllm", "--group", "2", "--block-size", "8KiB"),
		"verified 231 blocks (1.8 MiB) in every namespace")

	// clean removes vLLM's stale temporary files, and ours.
	leaf := filepath.Dir(path)
	stale := []string{path + "_8123456789.tmp", filepath.Join(leaf, "0123.bin_5.tmp")}
	kept := filepath.Join(leaf, "notes.tmp")
	old := time.Now().Add(-2 * time.Hour)
	for _, p := range append(stale, kept) {
		require.NoError(t, os.WriteFile(p, []byte("partial"), 0o644))
		require.NoError(t, os.Chtimes(p, old, old))
	}
	assert.Contains(t, mustRun(t, args("clean", dir, vflags)...), "removed 2 temporary files")
	for _, p := range stale {
		assert.NoFileExists(t, p)
	}
	assert.FileExists(t, kept)

	backdate(t, dir, v.Namespace(), time.Hour) // the evictor takes no block used within the last second
	out = mustRun(t, args("evict", dir, vflags, []string{"--max-size", "1MiB", "--json"})...)
	var ev struct {
		UsedSize  int64 `json:"used_size"`
		FreedSize int64 `json:"freed_size"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ev))
	assert.Equal(t, (total-1)*8192, ev.UsedSize)
	assert.LessOrEqual(t, ev.UsedSize-ev.FreedSize, int64(1<<20))
}

// TestVLLMConfigFlag: --vllm-config names the base directory and
// populate writes it; --vllm-base picks one of several.
func TestVLLMConfigFlag(t *testing.T) {
	// The default command in a temporary vLLM directory.
	t.Setenv("TMPDIR", t.TempDir())
	out := mustRun(t, append(append([]string{}, tiny...), "--layout", "vllm", "--model", "org/m")...)
	assert.Regexp(t, `(?m)^\s*sync\s+load\s+8\s+96\s`, out)

	dir := t.TempDir()
	rc := blockstore.VLLMRunConfig{ModelName: "org/m", HashBlockSize: 32, GPUBlocksPerFile: 2, TPSize: 4, PPSize: 1, PCPSize: 1, DCPSize: 1,
		DType: "float16", KVCacheGroups: []blockstore.VLLMKVCacheGroup{{BlockSize: 32, LayerNames: []string{"l0"}}}, InferenceEngine: "vllm"}
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfgPath, rc.ConfigJSON(), 0o644))
	mustRun(t, "populate", "--dir", dir, "--blocks", "4", "--block-size", "4KiB", "--layout", "vllm", "--vllm-config", cfgPath, "--rank", "3")
	v := blockstore.NewVLLM(rc, 3, 0, false)
	b, err := os.ReadFile(filepath.Join(dir, v.Base, "config.json"))
	require.NoError(t, err)
	assert.Equal(t, string(rc.ConfigJSON()), string(b))
	assert.DirExists(t, filepath.Join(dir, v.Namespace()))

	// Parallel agnostic: the sizes count as 1, the rank as 0.
	mustRun(t, "populate", "--dir", dir, "--blocks", "4", "--block-size", "4KiB", "--layout", "vllm", "--vllm-config", cfgPath, "--rank", "3", "--parallel-agnostic")
	a := blockstore.NewVLLM(rc, 3, 0, true)
	assert.DirExists(t, filepath.Join(dir, a.Namespace()))
	assert.True(t, strings.HasSuffix(a.Namespace(), "_r0"))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, a.Base)))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, a.Namespace())))

	// A second run config of the model: --model alone is ambiguous.
	mustRun(t, "populate", "--dir", dir, "--blocks", "4", "--block-size", "4KiB", "--layout", "vllm", "--model", "org/m", "--vllm-base", "org_m_0123456789ab", "--rank", "3")
	code, _, stderr := tierbench(t, args("lookup", dir, tinyWorkload, []string{"--layout", "vllm", "--model", "org/m", "--rank", "3"})...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "2 vLLM base directories")
	mustRun(t, args("lookup", dir, tinyWorkload, []string{"--layout", "vllm", "--model", "org/m", "--rank", "3", "--vllm-base", v.Base})...)
}

func TestVLLMBadUsage(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lookup", "--dir", dir, "--layout", "flat"}, "--layout"},
		{[]string{"lookup", "--dir", dir, "--model", "m"}, "--model is for --layout vllm"},
		{[]string{"lookup", "--dir", dir, "--layout", "vllm"}, "needs --model"},
		{[]string{"lookup", "--dir", dir, "--layout", "vllm", "--model", "m", "--namespace", "x"}, "--namespace with --layout vllm"},
		{[]string{"lookup", "--dir", dir, "--layout", "vllm", "--model", "m", "--format", "framed"}, "vLLM's blocks are raw"},
		{[]string{"lookup", "--dir", dir, "--layout", "vllm", "--model", "m", "--rank", "-1"}, "--rank -1"},
		{[]string{"lookup", "--dir", dir, "--format", "zip"}, "--format"},
		{[]string{"load", "--dir", dir, "--on-corrupt", "burn"}, "--on-corrupt"},
		{[]string{"populate", "--dir", dir, "--layout", "vllm", "--model", "a b"}, "invalid namespace"},
	} {
		code, stdout, stderr := tierbench(t, c.args...)
		assert.Equal(t, exitUsage, code, "%v: %s", c.args, stderr)
		assert.Empty(t, stdout, "%v", c.args)
		assert.Contains(t, stderr, c.want, "%v", c.args)
	}
	// A workload on a vLLM directory that is not there.
	code, _, stderr := tierbench(t, "lookup", "--dir", dir, "--layout", "vllm", "--model", "org/absent")
	assert.Equal(t, exitFailure, code)
	assert.True(t, strings.Contains(stderr, "org_absent_<12 hex>"), stderr)
}
