package blockstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
)

// vLLM's filesystem offloading tier (vllm/v1/kv_offload/tiering/fs:
// file_mapper.py names the files, io.py reads and writes them) keeps one
// raw block per file:
//
//	<root>/<model, '/' → '_'>_<12 hex>/config.json        the run config, written once
//	<root>/<model, '/' → '_'>_<12 hex>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin
//
// where the 12 hex digits begin the SHA-256 of the run config as compact
// JSON with sorted keys, and hex is the block hash's lowercase hex. Here
// the rank directory is the namespace (VLLM.Namespace), VLLMLayout the
// layout beneath it and FormatRaw the format; the KV-cache group is the
// layout's, so one layout (one tier) serves one group, and keys are the
// block hashes themselves.

// VLLMLayout is vLLM's layout beneath its rank directory:
// <hex[0:3]>/<hex[3:5]>_g<Group>/<hex>.bin. Temporary files are the
// block's path followed by _<decimal digits>.tmp, as vLLM names its own,
// so either side's clean-up recognises the other's.
type VLLMLayout struct {
	// Group is the KV-cache group index, 0 or more.
	Group int
}

var _ Layout = VLLMLayout{}

const (
	vllmSuffix    = ".bin"
	vllmTmpSuffix = ".tmp"
	// vllmBaseHashSize is how many hex digits of the run config's SHA-256
	// the base directory's name carries (file_mapper.py's
	// _BASE_PATH_HASH_LEN).
	vllmBaseHashSize = 12
	// vllmConfigName is the run config's file in the base directory.
	vllmConfigName = "config.json"
)

// AppendDir appends "<hex[0:3]>/<hex[3:5]>_g<group>".
func (l VLLMLayout) AppendDir(dst, key []byte) []byte {
	dst = append(dst, hexDigits[key[0]>>4], hexDigits[key[0]&0xf], hexDigits[key[1]>>4], '/',
		hexDigits[key[1]&0xf], hexDigits[key[2]>>4], '_', 'g')
	return strconv.AppendInt(dst, int64(l.Group), 10)
}

// AppendPath appends "<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin".
func (l VLLMLayout) AppendPath(dst, key []byte) []byte {
	dst = l.AppendDir(dst, key)
	dst = append(dst, '/')
	dst = appendHex(dst, key)
	return append(dst, vllmSuffix...)
}

// AppendTempPath appends "<path>_<digits>.tmp": the block's path, an
// underscore, the token (its low 63 bits, as vLLM's suffix is a random
// integer below 2**63) in decimal, and ".tmp".
func (l VLLMLayout) AppendTempPath(dst, key []byte, token uint64) []byte {
	dst = l.AppendPath(dst, key)
	dst = append(dst, '_')
	dst = strconv.AppendUint(dst, token&(1<<63-1), 10)
	return append(dst, vllmTmpSuffix...)
}

// KeyFromPath parses "<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin" of this
// layout's group, and checks that the directories match the name, so every
// key has exactly one path.
func (l VLLMLayout) KeyFromPath(rel string) ([]byte, bool) {
	d1, rest, ok := strings.Cut(rel, "/")
	if !ok || len(d1) != 3 {
		return nil, false
	}
	d2, name, ok := strings.Cut(rest, "/")
	if !ok || strings.IndexByte(name, '/') >= 0 || !strings.HasSuffix(name, vllmSuffix) {
		return nil, false
	}
	hexKey := name[:len(name)-len(vllmSuffix)]
	if len(hexKey) < 2*KeySizeMin || len(hexKey) > 2*KeySizeMax || hexKey[0:3] != d1 ||
		d2 != hexKey[3:5]+"_g"+strconv.Itoa(l.Group) {
		return nil, false
	}
	return decodeHex(hexKey)
}

// IsTempPath reports whether rel's file name ends in "_<digits>.tmp":
// this layout's temporary files, vLLM's (whose names are the same), and
// its O_DIRECT probes (".o_direct_probe_<digits>.tmp").
func (VLLMLayout) IsTempPath(rel string) bool {
	name := rel[strings.LastIndexByte(rel, '/')+1:]
	digits, ok := strings.CutSuffix(name, vllmTmpSuffix)
	if !ok {
		return false
	}
	i := len(digits)
	for i > 0 && '0' <= digits[i-1] && digits[i-1] <= '9' {
		i--
	}
	return i < len(digits) && i > 0 && digits[i-1] == '_'
}

// VLLMRunConfig is what vLLM hashes into its base directory's name and
// writes to config.json (file_mapper.py's fields), with the parallel
// sizes as the run has them.
type VLLMRunConfig struct {
	ModelName        string             `json:"model_name"`          // the model's name or path as vLLM was given it
	HashBlockSize    int                `json:"hash_block_size"`     // tokens per block hash (cache_config.block_size)
	GPUBlocksPerFile int                `json:"gpu_blocks_per_file"` // GPU blocks in one file
	TPSize           int                `json:"tp_size"`             // tensor parallel size
	PPSize           int                `json:"pp_size"`             // pipeline parallel size
	PCPSize          int                `json:"pcp_size"`            // prefill context parallel size
	DCPSize          int                `json:"dcp_size"`            // decode context parallel size
	DType            string             `json:"dtype"`               // the KV cache's dtype without "torch.", e.g. "bfloat16"
	KVCacheGroups    []VLLMKVCacheGroup `json:"kv_cache_groups"`     // the KV-cache groups, in order
	InferenceEngine  string             `json:"inference_engine"`    // "vllm"
}

// VLLMKVCacheGroup is one KV-cache group of a VLLMRunConfig.
type VLLMKVCacheGroup struct {
	BlockSize  int      `json:"block_size"`  // tokens per block
	LayerNames []string `json:"layer_names"` // the group's attention layers
}

// pyJSON returns c as Python's json module writes the dict vLLM builds:
// keys sorted, ASCII only; compact (separators "," and ":") for the
// digest, or indented by two spaces for config.json.
func (c VLLMRunConfig) pyJSON(indent bool) []byte {
	groups := make([]any, len(c.KVCacheGroups))
	for i, g := range c.KVCacheGroups {
		names := make([]any, len(g.LayerNames))
		for k, n := range g.LayerNames {
			names[k] = n
		}
		groups[i] = map[string]any{"block_size": g.BlockSize, "layer_names": names}
	}
	v := map[string]any{
		"model_name":          c.ModelName,
		"hash_block_size":     c.HashBlockSize,
		"gpu_blocks_per_file": c.GPUBlocksPerFile,
		"tp_size":             c.TPSize,
		"pp_size":             c.PPSize,
		"pcp_size":            c.PCPSize,
		"dcp_size":            c.DCPSize,
		"dtype":               c.DType,
		"kv_cache_groups":     groups,
		"inference_engine":    c.InferenceEngine,
	}
	step := ""
	if indent {
		step = "  "
	}
	return appendPyJSON(nil, v, step, "")
}

// appendPyJSON appends v (a map[string]any, []any, string or int) as
// json.dumps(v, sort_keys=True, indent=…) writes it: with an indent,
// separators ", " → "," at line ends and ": "; without, "," and ":" as
// vLLM asks for the digest; empty lists and objects as [] and {}.
func appendPyJSON(dst []byte, v any, step, cur string) []byte {
	sep, colon, inner := []byte(","), ":", cur+step
	if step != "" {
		sep, colon = []byte(",\n"+inner), ": "
	}
	open := func(c byte) {
		dst = append(dst, c)
		if step != "" {
			dst = append(append(dst, '\n'), inner...)
		}
	}
	closing := func(c byte) {
		if step != "" {
			dst = append(append(dst, '\n'), cur...)
		}
		dst = append(dst, c)
	}
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			return append(dst, "{}"...)
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys) // ASCII keys: byte order is Python's code point order
		open('{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, sep...)
			}
			dst = appendPyString(dst, k)
			dst = append(dst, colon...)
			dst = appendPyJSON(dst, v[k], step, inner)
		}
		closing('}')
	case []any:
		if len(v) == 0 {
			return append(dst, "[]"...)
		}
		open('[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, sep...)
			}
			dst = appendPyJSON(dst, e, step, inner)
		}
		closing(']')
	case string:
		dst = appendPyString(dst, v)
	case int:
		dst = strconv.AppendInt(dst, int64(v), 10)
	default:
		panic(fmt.Sprintf("blockstore: appendPyJSON: %T", v))
	}
	return dst
}

// appendPyString appends s quoted as Python's json.dumps does with
// ensure_ascii (the default): printable ASCII as it is but for '"' and
// '\\', the five short escapes, everything else \uXXXX in lower-case hex,
// as a UTF-16 surrogate pair beyond the BMP.
func appendPyString(dst []byte, s string) []byte {
	u := func(r rune) {
		dst = append(dst, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
	}
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r == '\b':
			dst = append(dst, `\b`...)
		case r == '\f':
			dst = append(dst, `\f`...)
		case ' ' <= r && r <= '~':
			dst = append(dst, byte(r))
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			u(r1)
			u(r2)
		default:
			u(r)
		}
	}
	return append(dst, '"')
}

// BaseName returns the base directory's name vLLM derives from c:
// "<model name with '/' replaced by '_'>_<first 12 hex digits of the
// SHA-256 of c as compact, key-sorted JSON>".
func (c VLLMRunConfig) BaseName() string {
	sum := sha256.Sum256(c.pyJSON(false))
	return strings.ReplaceAll(c.ModelName, "/", "_") + "_" + hex.EncodeToString(sum[:])[:vllmBaseHashSize]
}

// ConfigJSON returns config.json's content as vLLM writes it:
// json.dump(fields, f, indent=2, sort_keys=True), without a final newline.
func (c VLLMRunConfig) ConfigJSON() []byte { return c.pyJSON(true) }

// VLLM is where one vLLM worker's blocks are: the base directory, the rank
// and the KV-cache group. Make it with NewVLLM from the run config, or
// fill in Base for a directory that exists (FindVLLMBase finds it by
// model).
type VLLM struct {
	// Base is the base directory's name under the root,
	// "<model>_<12 hex>".
	Base string
	// Rank is the worker's rank; its blocks are under <Base>_r<Rank>.
	Rank int
	// Group is the KV-cache group whose blocks this is.
	Group int
	// Config is the run config Base was derived from, written to
	// config.json by WriteConfig; nil when only Base is known.
	Config *VLLMRunConfig
}

// NewVLLM is the place of rank's blocks of group in the directory of run
// config c. parallelAgnostic is vLLM's rule for a directory shared by
// every parallel layout: the four parallel sizes become 1 and the rank 0.
// An empty InferenceEngine becomes "vllm" and nil groups an empty list, as
// vLLM's defaults are.
func NewVLLM(c VLLMRunConfig, rank, group int, parallelAgnostic bool) VLLM {
	if parallelAgnostic {
		c.TPSize, c.PPSize, c.PCPSize, c.DCPSize, rank = 1, 1, 1, 1, 0
	}
	if c.InferenceEngine == "" {
		c.InferenceEngine = "vllm"
	}
	return VLLM{Base: c.BaseName(), Rank: rank, Group: group, Config: &c}
}

// Namespace returns the rank directory's name, "<Base>_r<Rank>": the
// namespace whose directory holds the blocks.
func (v VLLM) Namespace() string { return v.Base + "_r" + strconv.Itoa(v.Rank) }

// Layout returns the layout of Group's blocks.
func (v VLLM) Layout() VLLMLayout { return VLLMLayout{Group: v.Group} }

// Validate reports whether v names a rank directory that is a valid
// namespace, with a rank and group of 0 or more.
func (v VLLM) Validate() error {
	if v.Rank < 0 || v.Group < 0 {
		return fmt.Errorf("%w: vLLM rank %d, group %d (want 0 or more)", ErrInvalidOptions, v.Rank, v.Group)
	}
	if err := ValidateNamespace(v.Namespace()); err != nil {
		return fmt.Errorf("%w: vLLM base directory %q: %w", ErrInvalidOptions, v.Base, err)
	}
	if v.Config != nil && v.Config.BaseName() != v.Base {
		return fmt.Errorf("%w: vLLM base directory %q is not the run config's, %q", ErrInvalidOptions, v.Base, v.Config.BaseName())
	}
	return nil
}

// WriteConfig writes v.Config to <root>/<Base>/config.json, creating the
// base directory, unless the file exists, as vLLM's write_run_config
// does; nothing when v.Config is nil. The bytes are vLLM's; they go to a
// temporary file renamed into place, so a reader never sees half of them.
func (v VLLM) WriteConfig(root string) error {
	if v.Config == nil {
		return nil
	}
	dir := filepath.Join(root, v.Base)
	path := filepath.Join(dir, vllmConfigName)
	if err := MkdirAll(dir); err != nil {
		return err
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return err // there already (nil), or unknowable
	}
	tmp := path + "_" + strconv.FormatUint(NewTempToken()&(1<<63-1), 10) + vllmTmpSuffix
	if err := os.WriteFile(tmp, v.Config.ConfigJSON(), fileMode); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// ReadVLLMRunConfig reads a run config from a config.json as vLLM writes
// it (or any JSON object with its fields). A field it does not know is an
// error: vLLM hashes every field, so the base directory derived without
// it would not be vLLM's.
func ReadVLLMRunConfig(path string) (VLLMRunConfig, error) {
	var c VLLMRunConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: vLLM run config %s: %w", ErrInvalidOptions, path, err)
	}
	return c, nil
}

// FindVLLMBase returns the one base directory name under root for model:
// "<model, '/' → '_'>_<12 hex>", found as a base directory or as the
// prefix of a rank directory. It is an error wrapping fs.ErrNotExist when
// there is none, and one listing them when there are several (runs of the
// same model with other configs): the caller then names one.
func FindVLLMBase(root, model string) (string, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return "", err
	}
	prefix := strings.ReplaceAll(model, "/", "_") + "_"
	found := map[string]bool{}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.IsDir() || len(rest) < vllmBaseHashSize || !isLowerHex(rest[:vllmBaseHashSize]) {
			continue
		}
		if r, ok := strings.CutPrefix(rest[vllmBaseHashSize:], "_r"); rest[vllmBaseHashSize:] == "" || ok && isDigits(r) {
			found[prefix+rest[:vllmBaseHashSize]] = true
		}
	}
	names := make([]string, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	sort.Strings(names)
	switch len(names) {
	case 0:
		return "", &fs.PathError{Op: "find vLLM base directory", Path: filepath.Join(root, prefix+"<12 hex>"), Err: fs.ErrNotExist}
	case 1:
		return names[0], nil
	}
	return "", fmt.Errorf("%w: %d vLLM base directories for model %q under %s: %s", ErrInvalidOptions, len(names), model, root, strings.Join(names, ", "))
}

// VLLMSpec is how a caller names a vLLM place: by a run config file, by
// the base directory's name, or by the model, whose one base directory
// is found under the root (in that order of precedence; fields after the
// one used must agree with it).
type VLLMSpec struct {
	ConfigPath string // a run config, as vLLM writes config.json
	Base       string // the base directory's name, "<model>_<12 hex>"
	Model      string // the model's name as vLLM has it
	Rank       int    // the worker's rank
	Group      int    // the KV-cache group
	// ParallelAgnostic is vLLM's parallel_agnostic: one directory for
	// every parallel layout, the run config's parallel sizes 1 and the
	// rank 0.
	ParallelAgnostic bool
}

// ResolveVLLM returns the place s names under root. A model without a
// base directory is an error wrapping fs.ErrNotExist (only a run config
// can make a new one); inconsistent or ambiguous names wrap
// ErrInvalidOptions.
func ResolveVLLM(root string, s VLLMSpec) (VLLM, error) {
	var v VLLM
	if s.Rank < 0 || s.Group < 0 {
		return v, fmt.Errorf("%w: vLLM rank %d, group %d (want 0 or more)", ErrInvalidOptions, s.Rank, s.Group)
	}
	if s.ParallelAgnostic {
		s.Rank = 0
	}
	switch {
	case s.ConfigPath != "":
		c, err := ReadVLLMRunConfig(s.ConfigPath)
		if err != nil {
			return v, err
		}
		if s.Model != "" && c.ModelName != s.Model {
			return v, fmt.Errorf("%w: model %q, but the run config %s is of %q", ErrInvalidOptions, s.Model, s.ConfigPath, c.ModelName)
		}
		v = NewVLLM(c, s.Rank, s.Group, s.ParallelAgnostic)
		if s.Base != "" && s.Base != v.Base {
			return v, fmt.Errorf("%w: base directory %q, but the run config %s names %q", ErrInvalidOptions, s.Base, s.ConfigPath, v.Base)
		}
	case s.Base != "":
		if s.Model != "" && !strings.HasPrefix(s.Base, strings.ReplaceAll(s.Model, "/", "_")+"_") {
			return v, fmt.Errorf("%w: base directory %q is not of model %q", ErrInvalidOptions, s.Base, s.Model)
		}
		v = VLLM{Base: s.Base, Rank: s.Rank, Group: s.Group}
	case s.Model != "":
		base, err := FindVLLMBase(root, s.Model)
		if err != nil {
			return v, err
		}
		v = VLLM{Base: base, Rank: s.Rank, Group: s.Group}
	default:
		return v, fmt.Errorf("%w: a vLLM directory needs a model, a base directory or a run config", ErrInvalidOptions)
	}
	return v, v.Validate()
}

func isLowerHex(s string) bool {
	for i := range len(s) {
		if unhex(s[i]) < 0 {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
