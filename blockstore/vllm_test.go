package blockstore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goldenRunConfig is the run config of the golden tests. Its compact JSON,
// keys sorted, written out by hand from vLLM's rule:
//
//	{"dcp_size":1,"dtype":"bfloat16","gpu_blocks_per_file":4,"hash_block_size":16,"inference_engine":"vllm","kv_cache_groups":[{"block_size":16,"layer_names":["model.layers.0.self_attn.attn","model.layers.1.self_attn.attn"]}],"model_name":"meta-llama/Llama-3.1-8B-Instruct","pcp_size":1,"pp_size":1,"tp_size":2}
//
// has the SHA-256 (printf '%s' '<that>' | sha256sum)
// 367717149c392df17de3e76297b5c4f45c6fc16108be4362a5bc308f235bfa46; with
// "tp_size":1 instead, 1532e5be90d8831f3bec87dc0116b932186547498c3d4a0e9252092344f4057e.
var goldenRunConfig = VLLMRunConfig{
	ModelName:        "meta-llama/Llama-3.1-8B-Instruct",
	HashBlockSize:    16,
	GPUBlocksPerFile: 4,
	TPSize:           2,
	PPSize:           1,
	PCPSize:          1,
	DCPSize:          1,
	DType:            "bfloat16",
	KVCacheGroups: []VLLMKVCacheGroup{
		{BlockSize: 16, LayerNames: []string{"model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"}},
	},
}

// goldenConfigJSON is config.json for goldenRunConfig, as Python's
// json.dump(fields, f, indent=2, sort_keys=True) writes it: no final newline.
const goldenConfigJSON = `{
  "dcp_size": 1,
  "dtype": "bfloat16",
  "gpu_blocks_per_file": 4,
  "hash_block_size": 16,
  "inference_engine": "vllm",
  "kv_cache_groups": [
    {
      "block_size": 16,
      "layer_names": [
        "model.layers.0.self_attn.attn",
        "model.layers.1.self_attn.attn"
      ]
    }
  ],
  "model_name": "meta-llama/Llama-3.1-8B-Instruct",
  "pcp_size": 1,
  "pp_size": 1,
  "tp_size": 2
}`

func TestVLLMGolden(t *testing.T) {
	key := []byte{0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c}
	v := NewVLLM(goldenRunConfig, 3, 1, false)
	require.NoError(t, v.Validate())
	assert.Equal(t, "meta-llama_Llama-3.1-8B-Instruct_367717149c39", v.Base)
	assert.Equal(t, "meta-llama_Llama-3.1-8B-Instruct_367717149c39_r3", v.Namespace())
	assert.Equal(t, "dea/db_g1", string(v.Layout().AppendDir(nil, key)))
	assert.Equal(t, "dea/db_g1/deadbeef0102030405060708090a0b0c.bin", string(v.Layout().AppendPath(nil, key)))
	assert.Equal(t, "/kv/meta-llama_Llama-3.1-8B-Instruct_367717149c39_r3/dea/db_g1/deadbeef0102030405060708090a0b0c.bin",
		"/kv/"+v.Namespace()+"/"+string(v.Layout().AppendPath(nil, key)))
	assert.Equal(t, "dea/db_g1/deadbeef0102030405060708090a0b0c.bin_12345.tmp", string(v.Layout().AppendTempPath(nil, key, 12345)))
	assert.Equal(t, "dea/db_g1/deadbeef0102030405060708090a0b0c.bin_9223372036854775807.tmp",
		string(v.Layout().AppendTempPath(nil, key, ^uint64(0))), "the token's low 63 bits, as vLLM's random suffix")
	assert.Equal(t, goldenConfigJSON, string(v.Config.ConfigJSON()))

	// Parallel agnostic: the parallel sizes are 1 and the rank 0.
	a := NewVLLM(goldenRunConfig, 3, 0, true)
	assert.Equal(t, "meta-llama_Llama-3.1-8B-Instruct_1532e5be90d8", a.Base)
	assert.Equal(t, "meta-llama_Llama-3.1-8B-Instruct_1532e5be90d8_r0", a.Namespace())
	assert.Equal(t, 2, goldenRunConfig.TPSize, "NewVLLM changed the caller's config")
	assert.Contains(t, string(a.Config.ConfigJSON()), `"tp_size": 1`)
}

// TestVLLMJSONEscapes: strings as Python's json.dumps writes them with
// ensure_ascii (the outputs below are Python's), and empty lists.
func TestVLLMJSONEscapes(t *testing.T) {
	c := VLLMRunConfig{ModelName: "x\u00e9\U0001F600\"\\\n\x7f", InferenceEngine: "vllm"}
	assert.Equal(t, `{"dcp_size":0,"dtype":"","gpu_blocks_per_file":0,"hash_block_size":0,"inference_engine":"vllm","kv_cache_groups":[],"model_name":"x\u00e9\ud83d\ude00\"\\\n\u007f","pcp_size":0,"pp_size":0,"tp_size":0}`,
		string(c.pyJSON(false)))
	assert.Equal(t, `{
  "dcp_size": 0,
  "dtype": "",
  "gpu_blocks_per_file": 0,
  "hash_block_size": 0,
  "inference_engine": "vllm",
  "kv_cache_groups": [],
  "model_name": "x\u00e9\ud83d\ude00\"\\\n\u007f",
  "pcp_size": 0,
  "pp_size": 0,
  "tp_size": 0
}`, string(c.ConfigJSON()))
}

func TestVLLMLayoutPaths(t *testing.T) {
	l := VLLMLayout{Group: 12}
	for i := range 50 {
		key := testKey(i, 8+i%57)
		rel := string(l.AppendPath(nil, key))
		got, ok := l.KeyFromPath(rel)
		require.True(t, ok, rel)
		require.Equal(t, key, got)
		assert.False(t, l.IsTempPath(rel))
		assert.True(t, l.IsTempPath(string(l.AppendTempPath(nil, key, NewTempToken()))))
		_, ok = VLLMLayout{Group: 1}.KeyFromPath(rel)
		assert.False(t, ok, "another group's block")
	}
	for _, rel := range []string{
		"dea/db_g12/deadbeef0102030405060708090a0b0c.bin_5.tmp",
		"dea/db_g12/DEADBEEF0102030405060708090a0b0c.bin",
		"dea/dc_g12/deadbeef0102030405060708090a0b0c.bin",
		"dee/db_g12/deadbeef0102030405060708090a0b0c.bin",
		"dea/db_g012/deadbeef0102030405060708090a0b0c.bin",
		"dea/db/deadbeef0102030405060708090a0b0c.bin",
		"dea/db_g12/deadbeef0102030405060708090a0b0c.blk",
		"dea/db_g12/x/deadbeef0102030405060708090a0b0c.bin",
		"dea/db_g12/deadbeef01.bin",
		"config.json",
	} {
		_, ok := l.KeyFromPath(rel)
		assert.False(t, ok, rel)
	}
	for rel, want := range map[string]bool{
		"a/b/x.bin_123.tmp":      true,
		".o_direct_probe_42.tmp": true,
		"x.bin_.tmp":             false,
		"x.bin_12a.tmp":          false,
		"_1.tmp":                 true, // as the glob *_<digits>.tmp has it
		"x.bin.tmp":              false,
		"x.bin_123.tmpx":         false,
	} {
		assert.Equal(t, want, l.IsTempPath(rel), rel)
	}
}

func TestVLLMConfigFile(t *testing.T) {
	root := t.TempDir()
	v := NewVLLM(goldenRunConfig, 0, 0, false)
	require.NoError(t, v.WriteConfig(root))
	path := filepath.Join(root, "meta-llama_Llama-3.1-8B-Instruct_367717149c39", "config.json")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, goldenConfigJSON, string(b), "config.json byte for byte")
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")

	// Written once: a file there is never replaced.
	require.NoError(t, os.WriteFile(path, []byte("{}"), 0o644))
	require.NoError(t, v.WriteConfig(root))
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "{}", string(b))

	// Read back, it gives the same base directory.
	require.NoError(t, os.WriteFile(path, []byte(goldenConfigJSON), 0o644))
	c, err := ReadVLLMRunConfig(path)
	require.NoError(t, err)
	assert.Equal(t, v.Base, c.BaseName())

	// A field this package does not know would change vLLM's digest.
	require.NoError(t, os.WriteFile(path, []byte(`{"model_name": "m", "new_field": 1}`), 0o644))
	_, err = ReadVLLMRunConfig(path)
	require.ErrorIs(t, err, ErrInvalidOptions)
	assert.Contains(t, err.Error(), "new_field")

	// Only the base name known: nothing written.
	require.NoError(t, VLLM{Base: "m_0123456789ab"}.WriteConfig(root))
	assert.NoDirExists(t, filepath.Join(root, "m_0123456789ab"))
}

func TestFindVLLMBase(t *testing.T) {
	root := t.TempDir()
	_, err := FindVLLMBase(root, "org/model")
	require.True(t, errors.Is(err, fs.ErrNotExist), "%v", err)
	for _, d := range []string{"org_model_0123456789ab_r3", "org_model_0123456789ab_r0", "org_model_0123456789ab", "org_model_XYZ", "org_model_0123456789ab_rx", "other_0123456789ab"} {
		require.NoError(t, os.Mkdir(filepath.Join(root, d), 0o755))
	}
	base, err := FindVLLMBase(root, "org/model")
	require.NoError(t, err)
	assert.Equal(t, "org_model_0123456789ab", base)
	require.NoError(t, os.Mkdir(filepath.Join(root, "org_model_ba9876543210_r0"), 0o755))
	_, err = FindVLLMBase(root, "org/model")
	require.ErrorIs(t, err, ErrInvalidOptions)
	assert.True(t, strings.Contains(err.Error(), "org_model_0123456789ab, org_model_ba9876543210"), "%v", err)
}

func TestVLLMValidate(t *testing.T) {
	assert.ErrorIs(t, VLLM{Base: "m_0123456789ab", Rank: -1}.Validate(), ErrInvalidOptions)
	assert.ErrorIs(t, VLLM{Base: "m_0123456789ab", Group: -1}.Validate(), ErrInvalidOptions)
	assert.ErrorIs(t, VLLM{Base: "a b_0123456789ab"}.Validate(), ErrInvalidOptions)
	v := NewVLLM(goldenRunConfig, 0, 0, false)
	v.Base = "m_0123456789ab"
	assert.ErrorIs(t, v.Validate(), ErrInvalidOptions, "a base that is not the config's")
	assert.NoError(t, VLLM{Base: "m_0123456789ab", Rank: 7, Group: 3}.Validate())
}

func TestResolveVLLM(t *testing.T) {
	root := t.TempDir()
	const base, agnostic = "meta-llama_Llama-3.1-8B-Instruct_367717149c39", "meta-llama_Llama-3.1-8B-Instruct_1532e5be90d8"
	cfg := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfg, []byte(goldenConfigJSON), 0o644))

	v, err := ResolveVLLM(root, VLLMSpec{ConfigPath: cfg, Rank: 3, Group: 1})
	require.NoError(t, err)
	assert.Equal(t, base+"_r3", v.Namespace())
	assert.Equal(t, 1, v.Group)
	require.NotNil(t, v.Config, "a run config is kept, for config.json")
	v, err = ResolveVLLM(root, VLLMSpec{ConfigPath: cfg, Rank: 3, ParallelAgnostic: true})
	require.NoError(t, err)
	assert.Equal(t, agnostic+"_r0", v.Namespace())

	_, err = ResolveVLLM(root, VLLMSpec{Model: "meta-llama/Llama-3.1-8B-Instruct"})
	assert.ErrorIs(t, err, fs.ErrNotExist, "no base directory yet")
	require.NoError(t, os.Mkdir(filepath.Join(root, base+"_r3"), 0o755))
	v, err = ResolveVLLM(root, VLLMSpec{Model: "meta-llama/Llama-3.1-8B-Instruct", Rank: 2})
	require.NoError(t, err)
	assert.Equal(t, VLLM{Base: base, Rank: 2}, v)
	v, err = ResolveVLLM(root, VLLMSpec{Base: base, Model: "meta-llama/Llama-3.1-8B-Instruct", Group: 4})
	require.NoError(t, err)
	assert.Equal(t, VLLM{Base: base, Group: 4}, v)

	for _, s := range []VLLMSpec{
		{},
		{Model: "m", Rank: -1},
		{ConfigPath: cfg, Model: "org/other"},
		{ConfigPath: cfg, Base: "m_0123456789ab"},
		{Base: base, Model: "org/other"},
		{Base: "../up_0123456789ab"},
	} {
		_, err := ResolveVLLM(root, s)
		assert.ErrorIs(t, err, ErrInvalidOptions, "%+v", s)
	}
}
