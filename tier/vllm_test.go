package tier

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
)

// vLLM's directories on both engines: raw blocks in vLLM's layout, and a
// stand-alone script that follows vLLM's protocol (testdata/vllm_fs.py)
// writing and reading the same directory.

const vllmBlockSize = 16 << 10

// vllmRunConfig is the run config of these tests; the script gets the
// same fields as JSON.
var vllmRunConfig = blockstore.VLLMRunConfig{
	ModelName:        "org/Test-Model-1B",
	HashBlockSize:    16,
	GPUBlocksPerFile: 1,
	TPSize:           2,
	PPSize:           1,
	PCPSize:          1,
	DCPSize:          1,
	DType:            "bfloat16",
	KVCacheGroups:    []blockstore.VLLMKVCacheGroup{{BlockSize: 16, LayerNames: []string{"layers.0.attn", "layers.1.attn"}}},
	InferenceEngine:  "vllm",
}

// vllmKey and vllmPayload are block i's key and payload, as the script
// makes them.
func vllmKey(i int) []byte {
	k := sha256.Sum256(fmt.Appendf(nil, "vllm-key-%d", i))
	return k[:]
}

func vllmPayload(i int) []byte {
	p := make([]byte, 0, vllmBlockSize)
	for j := 0; len(p) < vllmBlockSize; j++ {
		h := sha256.Sum256(fmt.Appendf(nil, "%d/%d", i, j))
		p = append(p, h[:]...)
	}
	return p
}

func vllmKeys(first, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = vllmKey(first + i)
	}
	return keys
}

// openVLLM opens a tier on rank 1, group 2 of vllmRunConfig's directory
// under root.
func openVLLM(t *testing.T, kind EngineKind, root string, mod func(*Options)) (*Tier, blockstore.VLLM) {
	t.Helper()
	v := blockstore.NewVLLM(vllmRunConfig, 1, 2, false)
	tr := openTier(t, kind, root, func(o *Options) {
		o.BlockSize, o.VLLM = vllmBlockSize, &v
		if mod != nil {
			mod(o)
		}
	})
	require.Equal(t, v.Namespace(), tr.Namespace())
	return tr, v
}

// vllmPath is the absolute path of key's block.
func vllmPath(root string, v blockstore.VLLM, key []byte) string {
	return filepath.Join(root, v.Namespace(), string(v.Layout().AppendPath(nil, key)))
}

// loadVLLM loads keys into aligned buffers (O_DIRECT where the filesystem
// takes it) and returns the result and the buffers.
func loadVLLM(t *testing.T, tr *Tier, req uint64, keys [][]byte) (Result, [][]byte) {
	t.Helper()
	bufs := make([][]byte, len(keys))
	for i := range bufs {
		bufs[i] = alignedBytes(tr.BlockSize())
	}
	require.NoError(t, tr.Load(req, keys, bufs))
	return await(t, tr, req)[req], bufs
}

func storeVLLM(t *testing.T, tr *Tier, req uint64, first int, keys [][]byte) Result {
	t.Helper()
	bufs := make([][]byte, len(keys))
	for i := range bufs {
		bufs[i] = alignedBytes(tr.BlockSize())
		copy(bufs[i], vllmPayload(first+i))
	}
	require.NoError(t, tr.Store(req, keys, bufs))
	return await(t, tr, req)[req]
}

// TestVLLMRawCorrupt: in vLLM's directory, truncated, extended and empty
// files, a directory, a FIFO and a symlink to a good block are each
// corrupt to a load, on both engines; by default nothing in the directory
// changes (no quarantine, not even its directory), CorruptRemove deletes
// the files, CorruptQuarantine moves them.
func TestVLLMRawCorrupt(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		for _, action := range []blockstore.CorruptAction{blockstore.CorruptDefault, blockstore.CorruptRemove, blockstore.CorruptQuarantine} {
			t.Run(action.String(), func(t *testing.T) {
				root := t.TempDir()
				tr, v := openVLLM(t, kind, root, func(o *Options) { o.OnCorrupt = action })
				good := vllmPayload(0)
				plant := []struct {
					name, want string
					make       func(p string) error
				}{
					{"good", "", func(p string) error { return os.WriteFile(p, good, 0o644) }},
					{"truncated", "file is 100 bytes, the block size is 16384", func(p string) error { return os.WriteFile(p, good[:100], 0o644) }},
					{"extended", "file is 16385 bytes", func(p string) error { return os.WriteFile(p, append(append([]byte(nil), good...), 7), 0o644) }},
					{"zero-length", "file is 0 bytes, the block size is 16384", func(p string) error { return os.WriteFile(p, nil, 0o644) }},
					{"directory", "not a regular file (directory)", func(p string) error { return os.Mkdir(p, 0o755) }},
					{"fifo", "not a regular file (fifo)", func(p string) error { return unix.Mkfifo(p, 0o644) }},
					{"symlink to a good block", "symlink at block path", func(p string) error { return os.Symlink(vllmPath(root, v, vllmKey(0)), p) }},
					// Another tenant's tree, planted as the block's directory:
					// a file of the right size at the right name beneath it.
					{"symlinked directory on the way", "symlink at block path", func(p string) error {
						other := filepath.Join(root, "other-tenant")
						if err := os.MkdirAll(other, 0o755); err != nil {
							return err
						}
						if err := os.WriteFile(filepath.Join(other, filepath.Base(p)), good, 0o644); err != nil {
							return err
						}
						if err := os.Remove(filepath.Dir(p)); err != nil {
							return err
						}
						return os.Symlink(other, filepath.Dir(p))
					}},
				}
				keys := vllmKeys(0, len(plant))
				last := vllmPath(root, v, keys[len(keys)-1])
				for _, k := range keys[:len(keys)-1] {
					require.NotEqual(t, filepath.Dir(last), filepath.Dir(vllmPath(root, v, k)), "the planted link's directory holds only its own key")
				}
				for i, c := range plant {
					p := vllmPath(root, v, keys[i])
					require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
					require.NoError(t, c.make(p), c.name)
				}
				before := snapshot(t, root)
				res, bufs := loadVLLM(t, tr, 1, keys)
				for i, c := range plant {
					kr := res.Keys[i]
					if c.want == "" {
						require.Equal(t, StatusLoaded, kr.Status, "%s: %v", c.name, kr.Err)
						assert.Equal(t, good, bufs[i], "every byte")
						continue
					}
					require.Equal(t, StatusCorrupt, kr.Status, "%s: %v", c.name, kr.Err)
					assert.ErrorIs(t, kr.Err, blockstore.ErrCorrupt, c.name)
					assert.Contains(t, kr.Err.Error(), c.want, c.name)
				}
				after := snapshot(t, root)
				st := tr.Stats()
				_, qerr := os.Stat(filepath.Join(root, "~quarantine"))
				switch action {
				case blockstore.CorruptDefault:
					assert.Equal(t, before, after, "a load changed vLLM's directory")
					assert.ErrorIs(t, qerr, fs.ErrNotExist, "a quarantine directory was made")
					assert.Zero(t, st.Quarantined+st.QuarantineFailed+st.Removed+st.RemoveFailed)
				case blockstore.CorruptRemove:
					for i, c := range plant {
						_, err := os.Lstat(vllmPath(root, v, keys[i]))
						gone := c.name != "good" && c.name != "directory" && !strings.HasPrefix(c.name, "symlink")
						assert.Equal(t, gone, err != nil, "%s removed: %v", c.name, err)
					}
					assert.Equal(t, uint64(4), st.Removed, "truncated, extended, empty, FIFO")
					assert.Equal(t, uint64(1), st.RemoveFailed, "unlink of the directory")
					assert.ErrorIs(t, qerr, fs.ErrNotExist, "a quarantine directory was made")
				case blockstore.CorruptQuarantine:
					assert.Equal(t, uint64(5), st.Quarantined, "all but the good block and the link")
					q, err := os.ReadDir(filepath.Join(root, "~quarantine"))
					require.NoError(t, err)
					assert.Len(t, q, 5)
				}
			})
		}
	})
}

// TestVLLMRawStore: a store writes the payload alone at vLLM's path and
// nothing else; a block there already is not written again (Present), a
// file of the wrong size is replaced; the run config is written once.
func TestVLLMRawStore(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		root := t.TempDir()
		tr, v := openVLLM(t, kind, root, nil)
		cfg, err := os.ReadFile(filepath.Join(root, v.Base, "config.json"))
		require.NoError(t, err)
		assert.Equal(t, string(vllmRunConfig.ConfigJSON()), string(cfg))

		keys := vllmKeys(0, 4)
		require.NoError(t, os.MkdirAll(filepath.Dir(vllmPath(root, v, keys[3])), 0o755))
		require.NoError(t, os.WriteFile(vllmPath(root, v, keys[3]), []byte("short"), 0o644))
		res := storeVLLM(t, tr, 1, 0, keys)
		assert.Equal(t, []Status{StatusStored, StatusStored, StatusStored, StatusStored}, statuses(res), "%v", res.Keys)
		var inos []uint64
		for i, k := range keys {
			b, err := os.ReadFile(vllmPath(root, v, k))
			require.NoError(t, err)
			assert.Equal(t, vllmPayload(i), b, "block %d is its payload alone", i)
			var st unix.Stat_t
			require.NoError(t, unix.Stat(vllmPath(root, v, k), &st))
			inos = append(inos, st.Ino)
			entries, err := os.ReadDir(filepath.Dir(vllmPath(root, v, k)))
			require.NoError(t, err)
			for _, e := range entries {
				assert.True(t, strings.HasSuffix(e.Name(), ".bin"), "left behind: %s", e.Name())
			}
		}
		res = storeVLLM(t, tr, 2, 0, keys)
		assert.Equal(t, []Status{StatusPresent, StatusPresent, StatusPresent, StatusPresent}, statuses(res), "%v", res.Keys)
		for i, k := range keys {
			var st unix.Stat_t
			require.NoError(t, unix.Stat(vllmPath(root, v, k), &st))
			assert.Equal(t, inos[i], st.Ino, "block %d was written again", i)
		}
		res, bufs := loadVLLM(t, tr, 3, keys)
		for i := range keys {
			require.Equal(t, StatusLoaded, res.Keys[i].Status, "%v", res.Keys[i].Err)
			assert.Equal(t, vllmPayload(i), bufs[i])
		}

		// Another tenant's tree planted as a block's directory, with a
		// file of the right size at the block's name: the store must not
		// take it for the block (Present) nor write into that tree.
		k := vllmKeys(100, 1)
		p := vllmPath(root, v, k[0])
		other := filepath.Join(root, "other-tenant")
		require.NoError(t, os.MkdirAll(other, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(other, filepath.Base(p)), vllmPayload(7), 0o644))
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Dir(p)), 0o755))
		require.NoError(t, os.Symlink(other, filepath.Dir(p)))
		res = storeVLLM(t, tr, 4, 100, k)
		require.Equal(t, StatusFailed, res.Keys[0].Status, "%v", res.Keys[0].Err)
		assert.ErrorIs(t, res.Keys[0].Err, unix.ELOOP)
		entries, err := os.ReadDir(other)
		require.NoError(t, err)
		assert.Len(t, entries, 1, "nothing written into the other tree")
	})
}

// vllmScript runs testdata/vllm_fs.py cmd with args and decodes its JSON
// line. It skips the test without Python, unless CI is set.
func vllmScript(t *testing.T, ctx context.Context, cmd string, args map[string]any) map[string]any {
	t.Helper()
	c := vllmScriptCmd(t, ctx, cmd, args)
	out, err := c.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Logf("stderr: %s", ee.Stderr)
	}
	require.NoError(t, err, "vllm_fs.py %s", cmd)
	var m map[string]any
	require.NoError(t, json.Unmarshal(out, &m), "%s", out)
	return m
}

func vllmScriptCmd(t *testing.T, ctx context.Context, cmd string, args map[string]any) *exec.Cmd {
	t.Helper()
	py := os.Getenv("URINGTIER_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: no %s: %v", py, err)
		}
		t.Skipf("no %s: %v", py, err)
	}
	a, err := json.Marshal(args)
	require.NoError(t, err)
	c := exec.CommandContext(ctx, py, "testdata/vllm_fs.py", cmd, string(a))
	c.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	return c
}

// scriptArgs are the script's arguments for blocks first..first+n-1 of
// rank 1, group 2 under root.
func scriptArgs(root string, first, n int) map[string]any {
	var fields map[string]any
	b, _ := json.Marshal(vllmRunConfig)
	_ = json.Unmarshal(b, &fields)
	return map[string]any{"root": root, "fields": fields, "rank": 1, "group": 2, "block_size": vllmBlockSize, "first": first, "count": n}
}

// TestVLLMScriptDirectory: a directory written by the script, as vLLM
// writes it, is read by the tier on both engines with every byte checked
// and nothing in it changed; blocks the tier stores are read back by the
// script; both name the base directory and write config.json alike.
func TestVLLMScriptDirectory(t *testing.T) {
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 24
	out := vllmScript(t, ctx, "write", scriptArgs(root, 0, n))
	require.Equal(t, float64(n), out["stored"])
	require.Equal(t, true, out["direct"], "the script's probe write: O_DIRECT works here (ext4 or tmpfs)")
	v := blockstore.NewVLLM(vllmRunConfig, 1, 2, false)
	assert.Equal(t, v.Base, vllmScript(t, ctx, "base", scriptArgs(root, 0, 0))["base"], "the script and the tier name the base directory alike")
	cfg, err := os.ReadFile(filepath.Join(root, v.Base, "config.json"))
	require.NoError(t, err)
	assert.Equal(t, string(vllmRunConfig.ConfigJSON()), string(cfg), "config.json byte for byte")

	next := n
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		before := snapshot(t, root)
		tr, _ := openVLLM(t, kind, root, nil)
		require.True(t, tr.Engine().Direct, "loads and stores of the rank directory use O_DIRECT, as vLLM's do where probed: %s", tr.Engine().NoDirect)
		require.NoError(t, tr.Lookup(1, vllmKeys(0, n)))
		res := await(t, tr, 1)[1]
		assert.Equal(t, n, res.Prefix, "found: %v", statuses(res))
		res, bufs := loadVLLM(t, tr, 2, vllmKeys(0, n))
		for i := range n {
			require.Equal(t, StatusLoaded, res.Keys[i].Status, "block %d: %v", i, res.Keys[i].Err)
			require.Equal(t, vllmPayload(i), bufs[i], "block %d", i)
		}
		assert.Equal(t, before, snapshot(t, root), "reading changed the directory")

		// The tier's blocks, read back by the script.
		first := next
		next += 8
		res = storeVLLM(t, tr, 3, first, vllmKeys(first, 8))
		require.Equal(t, 8, res.Prefix, "%v", res.Keys)
		out := vllmScript(t, ctx, "read", scriptArgs(root, first, 8))
		assert.Equal(t, float64(8), out["ok"], "%v", out["bad"])
	})
}

// TestVLLMConcurrentWriters: the script and the tier remove, store and
// load the same blocks at once, over and over, for a few seconds per
// engine; neither ever sees a torn or wrong block (a miss is allowed: the
// other side removed the block meanwhile).
func TestVLLMConcurrentWriters(t *testing.T) {
	const n, seconds = 16, 3
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		root := t.TempDir()
		tr, v := openVLLM(t, kind, root, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		args := scriptArgs(root, 0, n)
		args["seconds"] = seconds
		cmd := vllmScriptCmd(t, ctx, "race", args)
		var stdout strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
		require.NoError(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()

		keys := vllmKeys(0, n)
		counts := map[Status]int{}
		var wrong []string
		req := uint64(0)
		for running := true; running; {
			select {
			case err := <-done:
				require.NoError(t, err, "the script failed")
				running = false
				continue
			default:
			}
			for _, k := range keys {
				if err := os.Remove(vllmPath(root, v, k)); err != nil {
					require.ErrorIs(t, err, fs.ErrNotExist)
				}
			}
			req++
			for i, kr := range storeVLLM(t, tr, req, 0, keys).Keys {
				require.True(t, kr.Status == StatusStored || kr.Status == StatusPresent, "store of block %d: %v %v", i, kr.Status, kr.Err)
				counts[kr.Status]++
			}
			req++
			res, bufs := loadVLLM(t, tr, req, keys)
			for i, kr := range res.Keys {
				counts[kr.Status]++
				switch kr.Status {
				case StatusLoaded:
					if string(bufs[i]) != string(vllmPayload(i)) {
						wrong = append(wrong, fmt.Sprintf("block %d: other bytes", i))
					}
				case StatusMissing:
				default:
					wrong = append(wrong, fmt.Sprintf("block %d: %v %v", i, kr.Status, kr.Err))
				}
			}
		}
		var py map[string]any
		require.NoError(t, json.Unmarshal([]byte(stdout.String()), &py), "%s", stdout.String())
		t.Logf("tier: %v; script: %v", counts, py)
		assert.Empty(t, wrong, "the tier saw torn or wrong blocks")
		for _, k := range []string{"short", "wrong", "errors"} {
			assert.Equal(t, float64(0), py[k], "the script saw %s blocks: %v", k, py["samples"])
		}
		assert.Positive(t, counts[StatusLoaded])
		assert.Positive(t, counts[StatusStored])
		assert.Positive(t, py["loads"])
		assert.Positive(t, py["stores"])
		// The two sides met: one found a block the other had just stored,
		// or missed one the other had just removed.
		assert.Positive(t, counts[StatusPresent]+counts[StatusMissing]+int(py["missing"].(float64)), "no sign that the writers overlapped")
	})
}

// TestVLLMOptions: Options.VLLM sets the namespace, layout and format, and
// Open refuses what contradicts it.
func TestVLLMOptions(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		root := t.TempDir()
		v := blockstore.NewVLLM(vllmRunConfig, 0, 1, false)
		for _, mod := range []func(*Options){
			func(o *Options) { o.Namespace = "other" },
			func(o *Options) { o.Layout = blockstore.FanoutLayout{} },
			func(o *Options) { o.Layout = blockstore.VLLMLayout{Group: 2} },
			func(o *Options) { o.VLLM = &blockstore.VLLM{Base: "a b_0123456789ab"} },
			func(o *Options) { o.VLLM, o.Format = nil, blockstore.Format(9) },
			func(o *Options) { o.OnCorrupt = blockstore.CorruptAction(9) },
		} {
			opts := Options{BlockSize: vllmBlockSize, Engine: kind, VLLM: &v}
			mod(&opts)
			_, err := Open(root, opts)
			require.ErrorIs(t, err, ErrInvalidOptions)
		}
		tr, err := Open(root, Options{BlockSize: vllmBlockSize, Engine: kind, VLLM: &v, Namespace: v.Namespace(), Layout: v.Layout()})
		require.NoError(t, err)
		defer tr.Close(context.Background())
		assert.Equal(t, v.Namespace(), tr.Namespace())
		assert.Equal(t, blockstore.FormatRaw, tr.BlockStore().Format())
		assert.Equal(t, blockstore.Layout(v.Layout()), tr.BlockStore().Layout())
	})
}
