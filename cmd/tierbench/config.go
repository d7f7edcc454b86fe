package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/tier"
)

// Defaults of the default run: small enough to finish in seconds on a
// 2-core machine, large enough that a lookup window (depth × batch keys)
// holds no key twice, so no lookup shares another's kernel operation.
const (
	defaultBlocks      = 4096
	defaultBlockSize   = 64 << 10
	defaultDuration    = 2 * time.Second
	defaultDepth       = 4
	defaultHitRatio    = 0.9
	defaultLookupBatch = 1024
	defaultIOBatch     = 16
	defaultOlderThan   = time.Hour
)

// config is every flag of every subcommand; each subcommand registers the
// ones it takes. Written by flag parsing, then read only.
type config struct {
	stdout, stderr io.Writer
	command        string
	set            []string // names of the flags given on the command line

	dir       string
	namespace string
	json      bool

	// populate and run
	blocks    int
	blockSize sizeFlag
	seed      uint64

	// workloads
	engine    string
	batch     int
	hitRatio  float64
	depth     int
	duration  time.Duration
	keys      int64
	direct    bool
	cold      bool
	latency   time.Duration
	keep      bool
	olderThan time.Duration
	maxSize   sizeFlag
	lowSize   sizeFlag
	repair    bool
}

func (c *config) isSet(name string) bool { return slices.Contains(c.set, name) }

// sizeFlag is a byte count given in human units (64KiB, 2MB).
type sizeFlag uint64

func (s *sizeFlag) String() string {
	if *s == 0 {
		return "0"
	}
	return humanize.IBytes(uint64(*s))
}

func (s *sizeFlag) Set(v string) error {
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return fmt.Errorf("not a size (try 64KiB or 2MB): %q", v)
	}
	*s = sizeFlag(n)
	return nil
}

func commonFlags(fs *flag.FlagSet, c *config) {
	fs.StringVar(&c.dir, "dir", "", "the tier's root directory (run: a fresh temporary directory if empty)")
	fs.StringVar(&c.namespace, "namespace", "default", "namespace (a directory under --dir)")
	fs.BoolVar(&c.json, "json", false, "machine output: one JSON object per line")
}

// validate checks what flag parsing cannot: ranges and combinations.
func (c *config) validate() error {
	needDir := c.command != "run"
	if needDir && c.dir == "" {
		return usagef("--dir is required")
	}
	if c.namespace != "" || c.command != "verify" && c.command != "du" {
		if err := blockstore.ValidateNamespace(c.namespace); err != nil {
			return usagef("--namespace %q: %v", c.namespace, err)
		}
	}
	switch c.command {
	case "run", "lookup", "load", "store":
		if c.engine != "all" {
			if _, err := tier.ParseEngine(c.engine); err != nil {
				return usagef("--engine %q: want auto, uring, sync or all", c.engine)
			}
		}
		if c.batch < 0 {
			return usagef("--batch %d: want a positive number", c.batch)
		}
		if c.hitRatio < 0 || c.hitRatio > 1 {
			return usagef("--hit-ratio %g: want a fraction from 0 to 1", c.hitRatio)
		}
		if c.depth < 1 || c.depth > 1<<14 {
			return usagef("--depth %d: want 1 to 16384", c.depth)
		}
		if c.isSet("keys") && c.isSet("duration") {
			return usagef("give --duration or --keys, not both")
		}
		if c.keys < 0 || c.duration <= 0 {
			return usagef("--keys and --duration must be positive")
		}
		if c.latency < 0 {
			return usagef("--latency %v: want a positive duration", c.latency)
		}
	case "populate":
		if _, err := tier.ParseEngine(c.engine); err != nil {
			return usagef("--engine %q: want auto, uring or sync", c.engine)
		}
		if c.depth < 1 {
			return usagef("--depth %d: want a positive number", c.depth)
		}
	case "evict":
		if !c.isSet("max-size") {
			return usagef("--max-size is required")
		}
		if c.lowSize > c.maxSize {
			return usagef("--low-size %v is above --max-size %v", &c.lowSize, &c.maxSize)
		}
	case "clean":
		if c.olderThan < 0 {
			return usagef("--older-than %v: want a positive duration", c.olderThan)
		}
	}
	if c.command == "run" || c.command == "populate" {
		if c.blocks < 1 {
			return usagef("--blocks %d: want a positive number", c.blocks)
		}
		if c.blockSize < 1 || c.blockSize > blockstore.PayloadSizeMax {
			return usagef("--block-size %v: want 1 byte to 16GiB", &c.blockSize)
		}
	}
	return nil
}
