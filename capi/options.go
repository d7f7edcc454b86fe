package main

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

// openOptions are ut_open's options: the tier's, and which vLLM directory
// layout=vllm names, which open resolves under the tier's directory.
type openOptions struct {
	tier.Options
	layout string              // "fanout" or "vllm"
	vllm   blockstore.VLLMSpec // layout=vllm: model, rank, group, vllm_base, vllm_config, parallel_agnostic
}

// optionSetters are ut_open's options (documented in uringtier.h), each
// parsing its value into openOptions. The tier validates the result.
var optionSetters = map[string]func(o *openOptions, v string) error{
	"block_size": intOption(func(o *openOptions) *int { return &o.BlockSize }),
	"namespace":  func(o *openOptions, v string) error { o.Namespace = v; return nil },
	"format": func(o *openOptions, v string) (err error) {
		if o.Format, err = blockstore.ParseFormat(v); err != nil {
			return fmt.Errorf("want framed or raw")
		}
		return nil
	},
	"on_corrupt": func(o *openOptions, v string) (err error) {
		if o.OnCorrupt, err = blockstore.ParseCorruptAction(v); err != nil {
			return fmt.Errorf("want default, leave, remove or quarantine")
		}
		return nil
	},
	"layout": func(o *openOptions, v string) error {
		if v != "fanout" && v != "vllm" {
			return fmt.Errorf("want fanout or vllm")
		}
		o.layout = v
		return nil
	},
	"model":       func(o *openOptions, v string) error { o.vllm.Model = v; return nil },
	"vllm_base":   func(o *openOptions, v string) error { o.vllm.Base = v; return nil },
	"vllm_config": func(o *openOptions, v string) error { o.vllm.ConfigPath = v; return nil },
	"rank":        intOption(func(o *openOptions) *int { return &o.vllm.Rank }),
	"group":       intOption(func(o *openOptions) *int { return &o.vllm.Group }),
	"parallel_agnostic": func(o *openOptions, v string) (err error) {
		o.vllm.ParallelAgnostic, err = strconv.ParseBool(v)
		return err
	},
	"engine": func(o *openOptions, v string) (err error) {
		if o.Engine, err = tier.ParseEngine(v); err != nil {
			return fmt.Errorf("want auto, uring or sync")
		}
		return nil
	},
	"depth":          intOption(func(o *openOptions) *int { return &o.Depth }),
	"batch_max":      intOption(func(o *openOptions) *int { return &o.BatchMax }),
	"lookup_timeout": durationOption(func(o *openOptions) *time.Duration { return &o.LookupTimeout }),
	"io_timeout":     durationOption(func(o *openOptions) *time.Duration { return &o.IOTimeout }),
	"cache_ttl": func(o *openOptions, v string) error {
		if err := durationOption(func(o *openOptions) *time.Duration { return &o.LookupCacheTTL })(o, v); err != nil {
			return err
		}
		if o.LookupCacheTTL == 0 {
			o.LookupCacheTTL = -1 // 0 turns the cache off; unset, the tier's default
		}
		return nil
	},
	"cache_size":        intOption(func(o *openOptions) *int { return &o.LookupCacheSize }),
	"rings":             intOption(func(o *openOptions) *int { return &o.Rings }),
	"ops_max":           intOption(func(o *openOptions) *int { return &o.OpsMax }),
	"workers_max":       intOption(func(o *openOptions) *int { return &o.WorkersMax }),
	"sync_workers":      intOption(func(o *openOptions) *int { return &o.SyncWorkers }),
	"breaker_threshold": intOption(func(o *openOptions) *int { return &o.BreakerThreshold }),
	"durability": func(o *openOptions, v string) error {
		for d := blockstore.DurabilityNone; d <= blockstore.DurabilityFull; d++ {
			if v == d.String() {
				o.Durability = d
				return nil
			}
		}
		return fmt.Errorf("want none, data or full")
	},
	"lookup_op": func(o *openOptions, v string) error {
		for l := tier.LookupOpenPath; l <= tier.LookupMixed; l++ {
			if v == l.String() {
				o.Lookup = l
				return nil
			}
		}
		return fmt.Errorf("want openpath, statx or mixed")
	},
	"direct": func(o *openOptions, v string) error {
		b, err := strconv.ParseBool(v)
		o.NoDirect = !b
		return err
	},
	"capacity": func(o *openOptions, v string) (err error) {
		if o.Capacity, err = strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("not an integer (bytes)")
		}
		return nil
	},
	"capacity_share": floatOption(func(o *openOptions) *float64 { return &o.CapacityShare }),
	"high_watermark": floatOption(func(o *openOptions) *float64 { return &o.HighWatermark }),
	"low_watermark":  floatOption(func(o *openOptions) *float64 { return &o.LowWatermark }),
	"evict_min_age":  offDurationOption(func(o *openOptions) *time.Duration { return &o.EvictMinAge }),
	"evict_interval": durationOption(func(o *openOptions) *time.Duration { return &o.EvictInterval }),
	"touch_interval": offDurationOption(func(o *openOptions) *time.Duration { return &o.TouchInterval }),
}

func intOption(field func(*openOptions) *int) func(*openOptions, string) error {
	return func(o *openOptions, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		*field(o) = n
		return nil
	}
}

func durationOption(field func(*openOptions) *time.Duration) func(*openOptions, string) error {
	return func(o *openOptions, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("not a duration with a unit (250ms, 5s)")
		}
		*field(o) = d
		return nil
	}
}

// offDurationOption parses a duration for which 0 means none (evict_min_age,
// touch_interval): the tier takes a negative one for that, and 0 for its
// default. A negative value is refused, so that the C ABI has one spelling.
func offDurationOption(field func(*openOptions) *time.Duration) func(*openOptions, string) error {
	return func(o *openOptions, v string) error {
		if err := durationOption(field)(o, v); err != nil {
			return err
		}
		switch d := field(o); {
		case *d < 0:
			return fmt.Errorf("negative; 0 turns it off")
		case *d == 0:
			*d = -1
		}
		return nil
	}
}

// floatOption parses a finite decimal number; the tier checks its range.
func floatOption(field func(*openOptions) *float64) func(*openOptions, string) error {
	return func(o *openOptions, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("not a finite number")
		}
		*field(o) = f
		return nil
	}
}

// parseOptions parses ut_open's option string: key=value pairs separated
// by spaces or commas. block_size is required; a key may appear once;
// model, rank, group, vllm_base and vllm_config go with layout=vllm, which
// takes no namespace.
func parseOptions(s string) (openOptions, error) {
	o := openOptions{layout: "fanout"}
	seen := make(map[string]bool)
	sep := func(r rune) bool { return r == ' ' || r == ',' || r == '\t' || r == '\n' }
	for _, kv := range strings.FieldsFunc(s, sep) {
		k, v, ok := strings.Cut(kv, "=")
		set := optionSetters[k]
		switch {
		case !ok:
			return o, fmt.Errorf("%w: %q is not key=value", tier.ErrInvalidOptions, kv)
		case set == nil:
			return o, fmt.Errorf("%w: unknown option %q", tier.ErrInvalidOptions, k)
		case seen[k]:
			return o, fmt.Errorf("%w: option %q given twice", tier.ErrInvalidOptions, k)
		}
		seen[k] = true
		if err := set(&o, v); err != nil {
			return o, fmt.Errorf("%w: %s=%q: %v", tier.ErrInvalidOptions, k, v, err)
		}
	}
	if !seen["block_size"] {
		return o, fmt.Errorf("%w: block_size is required", tier.ErrInvalidOptions)
	}
	if !seen["rings"] {
		o.Rings = defaultRings(runtime.GOMAXPROCS(0))
	}
	if o.layout == "vllm" {
		switch {
		case seen["namespace"]:
			return o, fmt.Errorf("%w: namespace with layout=vllm: the rank directory is the namespace (model, rank)", tier.ErrInvalidOptions)
		case seen["format"] && o.Format != blockstore.FormatRaw:
			return o, fmt.Errorf("%w: format=%v with layout=vllm: vLLM's blocks are raw", tier.ErrInvalidOptions, o.Format)
		}
		return o, nil
	}
	for _, k := range []string{"model", "rank", "group", "vllm_base", "vllm_config", "parallel_agnostic"} {
		if seen[k] {
			return o, fmt.Errorf("%w: %s is for layout=vllm", tier.ErrInvalidOptions, k)
		}
	}
	return o, nil
}

// defaultRings is the rings of a tier opened through the C ABI on procs
// Ps: one fewer than the Ps, at least 1, at most 8 (the Go API has a ring
// per P, at most 8). The caller here is a thread the Go runtime does not
// schedule (an interpreter's), which competes with the owners' inline work
// for the CPUs; with a ring per CPU the owners took a share of its CPU.
// python/bench/scheduler.py on 2 CPUs, 3 rounds, 8,192 keys a step: one
// ring answered 503 k keys/s against 430 k with two, the scheduler's step
// 14.0 ms against 17.7 (10 ms of work); through the 1 ms FUSE mount 7.2 k
// against 6.5 k (2 rounds); at 1,024 keys a step both answered all asked.
func defaultRings(procs int) int { return min(max(procs-1, 1), 8) }

// tierOptions resolves o's vLLM directory under dir, if it names one, and
// returns the tier's options.
func (o openOptions) tierOptions(dir string) (tier.Options, error) {
	if o.layout != "vllm" {
		return o.Options, nil
	}
	v, err := blockstore.ResolveVLLM(dir, o.vllm)
	if errors.Is(err, blockstore.ErrInvalidOptions) {
		return o.Options, fmt.Errorf("%w: %w", tier.ErrInvalidOptions, err)
	}
	if err != nil {
		return o.Options, err
	}
	o.VLLM = &v
	return o.Options, nil
}
