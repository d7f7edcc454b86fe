// Command tierbench benchmarks a uringtier directory and maintains it.
//
// With no arguments it populates a temporary directory with a modest data set,
// runs lookup, load and store workloads with every engine available on this
// machine, prints one side-by-side table and removes the directory. The other
// subcommands populate a real directory, run one workload against it (lookup,
// load, store, prefix) or several at once on one tier (mixed), draw a run's
// JSON lines (report), or run the block store's maintenance (verify, clean,
// du, evict). A workload can run in several processes on one directory
// (--jobs), print a line per interval (--interval), serve the tier's
// Prometheus metrics (--metrics-addr) and draw itself (--plot). Run
// "tierbench -h" for the usage text.
//
// The flags stay the standard library's flag package: each subcommand's file
// registers its FlagSet's flags, which a CLI library would not make clearer.
//
// Exit status: 0 on success, 1 on failure (an error, a key that failed, a
// corrupt block left), 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	flags   func(*flag.FlagSet, *config) // registers the subcommand's flags
	run     func(ctx context.Context, c *config) error
}

var commands = []command{
	{"run", "populate a data set and run every workload with every engine (the default)", workloadFlags(true), cmdRun},
	{"populate", "write a deterministic data set: key i = SHA-256(seed || i)", populateFlags, cmdPopulate},
	{"lookup", "benchmark lookups against a populated directory", workloadFlags(false), cmdWorkload("lookup")},
	{"load", "benchmark loads against a populated directory", workloadFlags(false), cmdWorkload("load")},
	{"store", "benchmark stores of new blocks into a populated directory", workloadFlags(false), cmdWorkload("store")},
	{"prefix", "benchmark prefix lookups: chains of keys, each request stopping at its first miss", workloadFlags(false), cmdWorkload("prefix")},
	{"mixed", "benchmark lookups and loads with and without stores at once on one tier: p99 side by side", mixedFlags, cmdMixed},
	{"report", "summarize a --json output file and draw it (--plot out.png or .svg)", reportFlags, cmdReport},
	{"verify", "checksum every block; exit status 1 if corrupt blocks remain", verifyFlags, cmdVerify},
	{"clean", "remove temporary files left by writers that died", cleanFlags, cmdClean},
	{"du", "blocks and bytes per namespace", nil, cmdDu},
	{"evict", "one pass of the tier's evictor: above --max-size, remove a namespace's least recently used blocks", evictFlags, cmdEvict},
}

// usageError is bad usage: run prints it with the usage text and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// run is the whole command: it parses args, runs the subcommand and returns
// the exit status. Tests call it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	name := "run"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	if name == "help" {
		printUsage(stdout, nil, nil)
		return exitOK
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "tierbench: unknown command %q\n\n", name)
		printUsage(stderr, nil, nil)
		return exitUsage
	}

	c := &config{stdout: stdout, stderr: stderr, command: cmd.name, args: args}
	fs := flag.NewFlagSet("tierbench "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints errors and usage itself
	commonFlags(fs, c)
	if cmd.flags != nil {
		cmd.flags(fs, c)
	}
	// Flags may come before and after arguments (report FILE --plot x).
	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage(stdout, cmd, fs)
				return exitOK
			}
			fmt.Fprintf(stderr, "tierbench %s: %v\n\n", cmd.name, err)
			printUsage(stderr, cmd, fs)
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	switch {
	case cmd.name == "report" && len(positional) == 1:
		c.input = positional[0]
	case cmd.name == "report":
		fmt.Fprintf(stderr, "tierbench report: want one FILE.jsonl\n\n")
		printUsage(stderr, cmd, fs)
		return exitUsage
	case len(positional) > 0:
		fmt.Fprintf(stderr, "tierbench %s: unexpected argument %q\n\n", cmd.name, positional[0])
		printUsage(stderr, cmd, fs)
		return exitUsage
	}
	fs.Visit(func(f *flag.Flag) { c.set = append(c.set, f.Name) })
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "tierbench %s: %v\n\n", cmd.name, err)
		printUsage(stderr, cmd, fs)
		return exitUsage
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.resolveVLLM()
	if err == nil {
		err = cmd.run(ctx, c)
	}
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "tierbench %s: %v\n\n", cmd.name, err)
		printUsage(stderr, cmd, fs)
		return exitUsage
	case errors.Is(err, errReported):
		return exitFailure
	default:
		fmt.Fprintf(stderr, "tierbench %s: %v\n", cmd.name, err)
		return exitFailure
	}
}

// errReported is a failure the subcommand has already described.
var errReported = errors.New("tierbench: failure already reported")

func printUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	if cmd == nil {
		fmt.Fprint(w, `tierbench — benchmark and maintain a uringtier directory

Usage:
  tierbench [run] [flags]            populate a temporary directory (or --dir), benchmark, clean up
  tierbench <command> --dir D [flags]
  tierbench report FILE.jsonl [--plot out.png]

Commands:
`)
		for _, c := range commands {
			fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
		}
		fmt.Fprint(w, `
Run "tierbench <command> -h" for a command's flags. Sizes take human units
(64KiB, 2MiB, 1.5GB); durations take Go syntax (500ms, 3s, 24h).
Exit status: 0 success, 1 failure, 2 bad usage.
`)
		return
	}
	fmt.Fprintf(w, "Usage: tierbench %s [flags]\n\n%s.\n\nFlags:\n", cmd.name, capitalize(cmd.summary))
	fs.VisitAll(func(f *flag.Flag) {
		if hiddenFlags[f.Name] {
			return
		}
		typ, help := flag.UnquoteUsage(f)
		if typ != "" {
			typ = " " + typ
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
			def = fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "  --%s%s\n    \t%s%s\n", f.Name, typ, help, def)
	})
}

func capitalize(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
