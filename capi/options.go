package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

// optionSetters are ut_open's options (documented in uringtier.h), each
// parsing its value into tier.Options. The tier validates the result.
var optionSetters = map[string]func(o *tier.Options, v string) error{
	"block_size": intOption(func(o *tier.Options) *int { return &o.BlockSize }),
	"namespace":  func(o *tier.Options, v string) error { o.Namespace = v; return nil },
	"engine": func(o *tier.Options, v string) (err error) {
		if o.Engine, err = tier.ParseEngine(v); err != nil {
			return fmt.Errorf("want auto, uring or sync")
		}
		return nil
	},
	"depth":          intOption(func(o *tier.Options) *int { return &o.Depth }),
	"batch_max":      intOption(func(o *tier.Options) *int { return &o.BatchMax }),
	"lookup_timeout": durationOption(func(o *tier.Options) *time.Duration { return &o.LookupTimeout }),
	"io_timeout":     durationOption(func(o *tier.Options) *time.Duration { return &o.IOTimeout }),
	"cache_ttl": func(o *tier.Options, v string) error {
		if err := durationOption(func(o *tier.Options) *time.Duration { return &o.LookupCacheTTL })(o, v); err != nil {
			return err
		}
		if o.LookupCacheTTL == 0 {
			o.LookupCacheTTL = -1 // 0 turns the cache off; unset, the tier's default
		}
		return nil
	},
	"cache_size":        intOption(func(o *tier.Options) *int { return &o.LookupCacheSize }),
	"rings":             intOption(func(o *tier.Options) *int { return &o.Rings }),
	"ops_max":           intOption(func(o *tier.Options) *int { return &o.OpsMax }),
	"workers_max":       intOption(func(o *tier.Options) *int { return &o.WorkersMax }),
	"sync_workers":      intOption(func(o *tier.Options) *int { return &o.SyncWorkers }),
	"breaker_threshold": intOption(func(o *tier.Options) *int { return &o.BreakerThreshold }),
	"durability": func(o *tier.Options, v string) error {
		for d := blockstore.DurabilityNone; d <= blockstore.DurabilityFull; d++ {
			if v == d.String() {
				o.Durability = d
				return nil
			}
		}
		return fmt.Errorf("want none, data or full")
	},
	"lookup_op": func(o *tier.Options, v string) error {
		for l := tier.LookupOpenPath; l <= tier.LookupMixed; l++ {
			if v == l.String() {
				o.Lookup = l
				return nil
			}
		}
		return fmt.Errorf("want openpath, statx or mixed")
	},
	"direct": func(o *tier.Options, v string) error {
		b, err := strconv.ParseBool(v)
		o.NoDirect = !b
		return err
	},
}

func intOption(field func(*tier.Options) *int) func(*tier.Options, string) error {
	return func(o *tier.Options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		*field(o) = n
		return nil
	}
}

func durationOption(field func(*tier.Options) *time.Duration) func(*tier.Options, string) error {
	return func(o *tier.Options, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("not a duration with a unit (250ms, 5s)")
		}
		*field(o) = d
		return nil
	}
}

// parseOptions parses ut_open's option string: key=value pairs separated
// by spaces or commas. block_size is required; a key may appear once.
func parseOptions(s string) (tier.Options, error) {
	var o tier.Options
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
	return o, nil
}
