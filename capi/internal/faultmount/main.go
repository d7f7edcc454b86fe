// Command faultmount serves a directory through the fault-injecting FUSE
// pass-through (faultfs) for tests and benchmarks written in other
// languages (python/tests, python/bench), which drive it over its standard
// input:
//
//	faultmount BACKING MOUNTPOINT
//
// It prints "ready" once mounted, then answers each command line with
// "ok [value]" or "error: message":
//
//	latency DURATION [PATTERN]  add DURATION to every operation (on paths matching PATTERN): ok RULE
//	hang OPS [PATTERN]          hold operations of kinds OPS (e.g. lookup,getattr or all) until released: ok RULE
//	release                     let every held operation go on: ok
//	reset                       remove every rule (and release): ok
//	fired RULE                  how many operations RULE matched: ok N
//	hung                        how many operations are held now: ok N
//	quit                        unmount and exit (so does end of input or SIGTERM)
//
// Needs root and /dev/fuse; it exits with
// status 3, saying why, where FUSE is unusable.
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	// The only import of faultfs outside linux_test: if it moves, this
	// line is the one to change.
	"github.com/uringtier/uringtier/internal/faultfs"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: faultmount BACKING MOUNTPOINT")
		os.Exit(2)
	}
	if err := faultfs.Available(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	fsys, err := faultfs.Mount(os.Args[2], os.Args[1], faultfs.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	lines := make(chan string)
	go func() {
		defer close(lines)
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			lines <- in.Text()
		}
	}()
	fmt.Println("ready")
	var rules []*faultfs.Rule
loop:
	for {
		select {
		case <-sig:
			break loop
		case line, ok := <-lines:
			if !ok || strings.TrimSpace(line) == "quit" {
				break loop
			}
			out, err := command(fsys, &rules, strings.Fields(line))
			if err != nil {
				fmt.Println("error:", err)
			} else {
				fmt.Println(strings.TrimSpace("ok " + out))
			}
		}
	}
	if err := fsys.Unmount(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func command(fsys *faultfs.FS, rules *[]*faultfs.Rule, args []string) (string, error) {
	if len(args) == 0 {
		return "", fmt.Errorf("empty command")
	}
	inject := func(f faultfs.Fault) (string, error) {
		if len(args) > 2 {
			f.Path = args[2]
		}
		r, err := fsys.Inject(f)
		if err != nil {
			return "", err
		}
		*rules = append(*rules, r)
		return strconv.Itoa(len(*rules) - 1), nil
	}
	switch args[0] {
	case "latency":
		if len(args) < 2 {
			return "", fmt.Errorf("latency DURATION [PATTERN]")
		}
		d, err := time.ParseDuration(args[1])
		if err != nil {
			return "", err
		}
		return inject(faultfs.Fault{Ops: faultfs.OpAll, Latency: d})
	case "hang":
		if len(args) < 2 {
			return "", fmt.Errorf("hang OPS [PATTERN]")
		}
		ops, err := parseOps(args[1])
		if err != nil {
			return "", err
		}
		return inject(faultfs.Fault{Ops: ops, Hang: true})
	case "release":
		fsys.Release()
		return "", nil
	case "reset":
		fsys.Reset()
		*rules = nil
		return "", nil
	case "fired":
		if len(args) != 2 {
			return "", fmt.Errorf("fired RULE")
		}
		i, err := strconv.Atoi(args[1])
		if err != nil || i < 0 || i >= len(*rules) {
			return "", fmt.Errorf("no rule %q", args[1])
		}
		return strconv.FormatInt(int64((*rules)[i].Fired()), 10), nil
	case "hung":
		return strconv.Itoa(fsys.Hung()), nil
	}
	return "", fmt.Errorf("unknown command %q", args[0])
}

// parseOps parses "all" or kind names joined by commas ("lookup,getattr"),
// as faultfs.OpKind.String prints them.
func parseOps(s string) (faultfs.OpKind, error) {
	if s == "all" {
		return faultfs.OpAll, nil
	}
	var ops faultfs.OpKind
	for _, name := range strings.Split(s, ",") {
		var found bool
		for k := faultfs.OpKind(1); k&faultfs.OpAll != 0; k <<= 1 {
			if k.String() == name {
				ops, found = ops|k, true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown operation kind %q", name)
		}
	}
	return ops, nil
}
