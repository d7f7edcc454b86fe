package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"strconv"

	"github.com/uringtier/uringtier/blockstore"
)

// --layout vllm: one rank's blocks of one KV-cache group in a directory of
// vLLM's filesystem offloading tier, raw, whose base directory is found
// under --dir by --model (or named by --vllm-base, or derived from a run
// config, --vllm-config).

func layoutFlags(fs *flag.FlagSet, c *config) {
	fs.StringVar(&c.layout, "layout", "fanout", "block layout: fanout (<ns>/<aa>/<bb>/<hex>.blk) or vllm (vLLM's filesystem tier: <model>_<12 hex>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin)")
	fs.StringVar(&c.format, "format", "", "block file format: framed (a header with checksums) or raw (the payload alone, valid at exactly the block size); default: raw with --layout vllm, else framed")
	fs.StringVar(&c.model, "model", "", "--layout vllm: the model's name as vLLM has it (org/name); its base directory <model with / → _>_<12 hex> is found under --dir")
	fs.IntVar(&c.rank, "rank", 0, "--layout vllm: the worker's rank, whose blocks are under <base>_r<rank>")
	fs.IntVar(&c.group, "group", 0, "--layout vllm: the KV-cache group")
	fs.StringVar(&c.vllmBase, "vllm-base", "", "--layout vllm: the base directory's name (<model>_<12 hex>), when --dir holds several for the model")
	fs.StringVar(&c.vllmConfig, "vllm-config", "", "--layout vllm: a run config as vLLM writes config.json; it names the base directory, and populate writes it there")
	fs.BoolVar(&c.parallelAgnostic, "parallel-agnostic", false, "--layout vllm: vLLM's parallel_agnostic, one directory for every parallel layout: --vllm-config's parallel sizes count as 1, the rank is 0")
}

// onCorruptFlag registers --on-corrupt, for the commands that open a tier.
func onCorruptFlag(fs *flag.FlagSet, c *config) {
	fs.StringVar(&c.onCorrupt, "on-corrupt", "default", "tier option OnCorrupt, what a load does with a corrupt block: default (quarantine a framed one, leave a raw one), leave, remove or quarantine")
}

// vllmFlags are the flags that only --layout vllm takes.
var vllmFlags = []string{"model", "rank", "group", "vllm-base", "vllm-config", "parallel-agnostic"}

// validateLayout checks the layout flags' combinations.
func (c *config) validateLayout() error {
	if _, err := c.blockFormat(); err != nil {
		return usagef("--format %q: want framed or raw", c.format)
	}
	if _, err := blockstore.ParseCorruptAction(c.onCorrupt); err != nil {
		return usagef("--on-corrupt %q: want default, leave, remove or quarantine", c.onCorrupt)
	}
	switch c.layout {
	case "fanout":
		for _, name := range vllmFlags {
			if c.isSet(name) {
				return usagef("--%s is for --layout vllm", name)
			}
		}
		return nil
	case "vllm":
	default:
		return usagef("--layout %q: want fanout or vllm", c.layout)
	}
	switch {
	case c.isSet("namespace"):
		return usagef("--namespace with --layout vllm: the rank directory is the namespace (--model, --rank)")
	case c.format == "framed":
		return usagef("--format framed with --layout vllm: vLLM's blocks are raw")
	case c.rank < 0 || c.group < 0:
		return usagef("--rank %d, --group %d: want 0 or more", c.rank, c.group)
	case c.model == "" && c.vllmBase == "" && c.vllmConfig == "" && c.needsNamespace():
		return usagef("--layout vllm needs --model (or --vllm-base or --vllm-config)")
	}
	return nil
}

// needsNamespace reports whether the command works in one namespace: all
// but the maintenance of the whole directory (verify and du without one
// cover every namespace; clean always does). evict works in one: the
// capacity and the evictor's lease are a namespace directory's.
func (c *config) needsNamespace() bool {
	switch c.command {
	case "verify", "du", "clean", "report":
		return false
	}
	return true
}

// blockFormat is the format --format (or the layout) asks for.
func (c *config) blockFormat() (blockstore.Format, error) {
	if c.format == "" && c.layout == "vllm" {
		return blockstore.FormatRaw, nil
	}
	return blockstore.ParseFormat(c.format)
}

// blockLayout is the layout of --layout.
func (c *config) blockLayout() blockstore.Layout {
	if c.layout == "vllm" {
		return blockstore.VLLMLayout{Group: c.group}
	}
	return blockstore.FanoutLayout{}
}

// resolveVLLM finds the vLLM base directory --layout vllm names, makes
// c.vllm the place of --rank's blocks of --group and c.namespace its rank
// directory. A command that populates a directory without one derives it
// from --vllm-config, or from a run config of --model with vLLM's defaults
// (defaultVLLMRunConfig).
func (c *config) resolveVLLM() error {
	if c.layout != "vllm" {
		return nil
	}
	spec := blockstore.VLLMSpec{ConfigPath: c.vllmConfig, Base: c.vllmBase, Model: c.model, Rank: c.rank, Group: c.group,
		ParallelAgnostic: c.parallelAgnostic}
	if spec.ConfigPath == "" && spec.Base == "" && spec.Model == "" {
		c.namespace = "" // every namespace of the directory
		return nil
	}
	v, err := blockstore.ResolveVLLM(c.dir, spec)
	switch {
	case errors.Is(err, fs.ErrNotExist) && spec.ConfigPath == "" && spec.Base == "" && (c.command == "populate" || c.command == "run"):
		v = blockstore.NewVLLM(defaultVLLMRunConfig(c.model), c.rank, c.group, c.parallelAgnostic)
		if err := v.Validate(); err != nil {
			return usagef("--layout vllm: %v", err)
		}
	case errors.Is(err, blockstore.ErrInvalidOptions):
		return usagef("--layout vllm: %v", err)
	case err != nil:
		return fmt.Errorf("--layout vllm: %w", err)
	}
	c.vllm, c.namespace = &v, v.Namespace()
	return nil
}

// defaultVLLMRunConfig is the run config populate gives a new vLLM
// directory of model when no --vllm-config says otherwise: vLLM's default
// block size, a bfloat16 KV cache (the field holds the cache's torch
// dtype, never vLLM's "auto"), one GPU block per file, no parallelism.
func defaultVLLMRunConfig(model string) blockstore.VLLMRunConfig {
	return blockstore.VLLMRunConfig{ModelName: model, HashBlockSize: 16, GPUBlocksPerFile: 1,
		TPSize: 1, PPSize: 1, PCPSize: 1, DCPSize: 1, DType: "bfloat16", InferenceEngine: "vllm"}
}

// dataSet names the data set's manifest: the namespace, and with --layout
// vllm the group too, since one rank directory holds every group's blocks.
func (c *config) dataSet() string {
	if c.vllm != nil {
		return c.namespace + "_g" + strconv.Itoa(c.group)
	}
	return c.namespace
}
