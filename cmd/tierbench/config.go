package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
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
	defaultWarmup      = 200 * time.Millisecond
	defaultDepth       = 4
	defaultHitRatio    = 0.9
	defaultMissKeys    = 1 << 16
	defaultLookupBatch = 1024
	defaultIOBatch     = 16
	defaultChain       = 16 // keys of a prefix lookup's chain
	defaultOlderThan   = time.Hour
)

// config is every flag of every subcommand; each subcommand registers the
// ones it takes. Written by flag parsing, then read only.
type config struct {
	stdout, stderr io.Writer
	command        string
	args           []string // the command line after the subcommand's name, for --jobs' processes
	set            []string // names of the flags given on the command line

	dir       string
	namespace string // with --layout vllm, the rank directory's name once resolveVLLM has run
	json      bool

	// layout and format
	layout     string // fanout or vllm
	format     string // framed, raw, or "": the layout's
	onCorrupt  string // tier option OnCorrupt
	model      string // vllm: the model, whose base directory is under dir
	rank       int    // vllm: the worker's rank
	group      int    // vllm: the KV-cache group
	vllmBase   string // vllm: the base directory's name
	vllmConfig string // vllm: a run config file
	// vllm: parallel_agnostic, one directory for every parallel layout
	parallelAgnostic bool
	vllm             *blockstore.VLLM // vllm: the place of the blocks, set by resolveVLLM; nil without a model

	// populate and run
	blocks    int
	blockSize sizeFlag
	seed      uint64

	// workloads
	engine    string
	workloads string // run: the workloads, comma-separated
	batch     perOp
	hitRatio  float64
	missKeys  int // --miss-keys
	depth     perOp
	duration  time.Duration
	keys      int64
	direct    bool
	cold      bool
	warmup    time.Duration // each workload runs this long before it is measured
	latency   time.Duration
	keep      bool
	olderThan time.Duration
	maxSize   sizeFlag
	lowSize   sizeFlag
	minAge    time.Duration // evict: blocks used more recently stay; 0: none
	repair    bool

	// capacity of the tier the workloads open (0: unbounded)
	capacity      sizeFlag
	capacityShare float64
	keepFree      float64       // store workloads stop once less than this share of the filesystem is free
	evictMinAge   time.Duration // 0: the tier's default

	// mixed
	mix        perOp    // streams of each workload at once on one tier
	storeBytes sizeFlag // payload the mixed phase's stores write; 0: as long as the readers run
	baseline   bool     // run the mix without its stores first

	// key distribution
	dist      string  // uniform, zipf or hot
	zipfS     float64 // zipf: the exponent s > 1
	hotKeys   float64 // hot: the fraction of the data set that is hot
	hotShare  float64 // hot: the fraction of accesses that go to it
	chainKeys int     // prefix: keys per chain (the batch)

	// tier options (0 or "": the tier's default)
	rings            int
	lookupOp         string
	opsMax           int
	workersMax       int
	syncWorkers      int
	storesOnRing     bool
	cacheTTL         time.Duration
	durability       string
	breakerThreshold int
	lookupTimeout    time.Duration
	ioTimeout        time.Duration

	// observing a run
	interval    time.Duration // a line per interval; 0: none
	metricsAddr string        // serve Prometheus metrics here during the run
	plot        string        // draw the run into this PNG or SVG file
	trace       string        // write a Go execution trace of each measured stretch to files named so
	jobs        int           // processes, each with its own tier, on one directory
	rounds      int           // run the engines this many times, in alternating order
	interleave  int           // run each workload in this many slices per engine, the engines taking turns (0: one after the other)
	jobIndex    int           // in a job's process: its index; -1 in the parent

	// report
	input string // report: the JSON lines to read
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
	layoutFlags(fs, c)
}

// perOp is an integer per workload: "8" for every workload, or
// "lookup=1024,load=16" for some, the rest taking their default.
type perOp struct {
	all    int            // for every workload not in by, if allSet
	allSet bool           // all was given (or is the flag's default)
	by     map[string]int // per workload name
	text   string         // as given
}

func (p *perOp) String() string {
	if p.text == "" && p.allSet {
		return strconv.Itoa(p.all)
	}
	return p.text
}

func (p *perOp) Set(v string) error {
	p.text, p.all, p.allSet, p.by = v, 0, false, nil
	if n, err := strconv.Atoi(v); err == nil {
		p.all, p.allSet = n, true
		return nil
	}
	for _, part := range strings.Split(v, ",") {
		name, num, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(num)
		if _, known := workloadOps[name]; !ok || err != nil || !known {
			return fmt.Errorf("want N or workload=N,... (workloads: lookup, load, store, prefix): %q", v)
		}
		if p.by == nil {
			p.by = map[string]int{}
		}
		p.by[name] = n
	}
	return nil
}

// get returns the value for workload, or def if none was given.
func (p *perOp) get(workload string, def int) int {
	if n, ok := p.by[workload]; ok {
		return n
	}
	if p.allSet && p.all != 0 {
		return p.all
	}
	return def
}

// values returns every value given.
func (p *perOp) values() []int {
	var v []int
	if p.allSet {
		v = append(v, p.all)
	}
	for _, n := range p.by {
		v = append(v, n)
	}
	return v
}

// lookupOps names the io_uring lookup operations (--lookup-op).
var lookupOps = map[string]tier.LookupOp{"statx": tier.LookupStatx, "mixed": tier.LookupMixed, "openpath": tier.LookupOpenPath}

// durabilities names the store durabilities (--durability).
var durabilities = map[string]blockstore.Durability{"none": blockstore.DurabilityNone, "data": blockstore.DurabilityData, "full": blockstore.DurabilityFull}

// isWorkload reports whether the command runs workloads.
func (c *config) isWorkload() bool {
	switch c.command {
	case "run", "lookup", "load", "store", "prefix", "mixed":
		return true
	}
	return false
}

// workloadNames returns the workloads the command runs, in order.
func (c *config) workloadNames() []string {
	switch c.command {
	case "run":
		return strings.Split(c.workloads, ",")
	case "mixed":
		var names []string
		for _, name := range mixOrder {
			if c.mix.get(name, 0) > 0 {
				names = append(names, name)
			}
		}
		return names
	}
	return []string{c.command}
}

// validate checks what flag parsing cannot: ranges and combinations.
func (c *config) validate() error {
	if c.command == "report" {
		return nil
	}
	needDir := c.command != "run"
	if needDir && c.dir == "" {
		return usagef("--dir is required")
	}
	if c.layout != "vllm" && (c.namespace != "" || c.command != "verify" && c.command != "du") {
		if err := blockstore.ValidateNamespace(c.namespace); err != nil {
			return usagef("--namespace %q: %v", c.namespace, err)
		}
	}
	if err := c.validateLayout(); err != nil {
		return err
	}
	if c.isWorkload() {
		if err := c.validateWorkload(); err != nil {
			return err
		}
	}
	switch c.command {
	case "run", "lookup", "load", "store", "prefix", "mixed":
		if c.engine != "all" {
			if _, err := tier.ParseEngine(c.engine); err != nil {
				return usagef("--engine %q: want auto, uring, sync or all", c.engine)
			}
		}
		for _, n := range c.batch.values() {
			if n < 0 {
				return usagef("--batch %d: want a positive number", n)
			}
		}
		if c.hitRatio < 0 || c.hitRatio > 1 {
			return usagef("--hit-ratio %g: want a fraction from 0 to 1", c.hitRatio)
		}
		if c.missKeys < 1 || c.missKeys > 1<<27 {
			return usagef("--miss-keys %d: want 1 to %d (4 GiB of keys)", c.missKeys, 1<<27)
		}
		for _, n := range c.depth.values() {
			if n < 1 || n > 1<<14 {
				return usagef("--depth %d: want 1 to 16384", n)
			}
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
		if c.command == "mixed" {
			if err := c.validateMix(); err != nil {
				return err
			}
		}
	case "populate":
		if _, err := tier.ParseEngine(c.engine); err != nil {
			return usagef("--engine %q: want auto, uring or sync", c.engine)
		}
		if c.depth.get("store", 1) < 1 || len(c.depth.by) > 0 {
			return usagef("--depth %v: want a positive number", &c.depth)
		}
	case "evict":
		if !c.isSet("max-size") {
			return usagef("--max-size is required")
		}
		if c.maxSize == 0 || c.maxSize > math.MaxInt64 {
			return usagef("--max-size %v: want a positive size", &c.maxSize)
		}
		if c.minAge < 0 {
			return usagef("--min-age %v: want 0 or more", c.minAge)
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

// validateWorkload checks the flags of the workload commands that are not
// about the data set.
func (c *config) validateWorkload() error {
	for _, name := range c.workloadNames() {
		if _, ok := workloadOps[name]; !ok {
			return usagef("--workloads: unknown workload %q (want lookup, load, store or prefix)", name)
		}
	}
	switch c.dist {
	case "uniform":
	case "zipf":
		if c.zipfS <= 1 {
			return usagef("--zipf-s %g: want more than 1", c.zipfS)
		}
	case "hot":
		if c.hotKeys <= 0 || c.hotKeys >= 1 || c.hotShare < 0 || c.hotShare > 1 {
			return usagef("--hot-keys %g, --hot-share %g: want a fraction above 0 and below 1, and a fraction from 0 to 1", c.hotKeys, c.hotShare)
		}
	default:
		return usagef("--dist %q: want uniform, zipf or hot", c.dist)
	}
	if _, ok := lookupOps[c.lookupOp]; !ok {
		return usagef("--lookup-op %q: want openpath, statx or mixed", c.lookupOp)
	}
	if _, ok := durabilities[c.durability]; !ok {
		return usagef("--durability %q: want none, data or full", c.durability)
	}
	for name, v := range map[string]int{"rings": c.rings, "ops-max": c.opsMax, "workers-max": c.workersMax,
		"sync-workers": c.syncWorkers, "breaker-threshold": c.breakerThreshold} {
		if v < 0 {
			return usagef("--%s %d: want a positive number (0: the tier's default)", name, v)
		}
	}
	if c.capacity > math.MaxInt64 || c.capacityShare < 0 || c.capacityShare > 1 || c.capacity > 0 && c.capacityShare > 0 {
		return usagef("--capacity %v, --capacity-share %g: want one of a size and a fraction from 0 to 1", &c.capacity, c.capacityShare)
	}
	if c.keepFree < 0 || c.keepFree >= 1 {
		return usagef("--keep-free %g: want a fraction from 0 to below 1", c.keepFree)
	}
	if c.cacheTTL < 0 || c.lookupTimeout < 0 || c.ioTimeout < 0 || c.interval < 0 || c.warmup < 0 {
		return usagef("--cache-ttl, --lookup-timeout, --io-timeout, --interval and --warmup must not be negative")
	}
	if c.interval > 0 && c.interval < 10*time.Millisecond {
		return usagef("--interval %v: want 10ms or more", c.interval)
	}
	if c.jobs < 1 || c.jobs > 256 {
		return usagef("--jobs %d: want 1 to 256", c.jobs)
	}
	if c.rounds < 1 || c.rounds > 1000 {
		return usagef("--rounds %d: want 1 to 1000", c.rounds)
	}
	if c.rounds > 1 && (c.jobs > 1 || c.command == "mixed") {
		return usagef("--rounds with --jobs or mixed: not supported; run the command again instead")
	}
	if c.interleave < 0 || c.interleave > 1000 {
		return usagef("--interleave %d: want 1 to 1000 slices (0: the engines one after the other)", c.interleave)
	}
	if c.interleave > 0 && (c.engine != "all" || c.jobs > 1 || c.command == "mixed" || c.cold || c.trace != "" ||
		c.interval > 0 || c.plot != "" || c.metricsAddr != "" || c.capacity > 0 || c.capacityShare > 0) {
		return usagef("--interleave: with --engine all alone; not with --jobs, mixed, --cold, --trace, --interval, --plot, --metrics-addr or --capacity")
	}
	if c.jobs > 1 && c.latency > 0 {
		return usagef("--latency with --jobs: each job would mount its own FUSE; run the jobs without --latency")
	}
	if c.plot != "" && !strings.HasSuffix(c.plot, ".png") && !strings.HasSuffix(c.plot, ".svg") {
		return usagef("--plot %q: want a .png or .svg file", c.plot)
	}
	return nil
}
