package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func reportFlags(fs *flag.FlagSet, c *config) {
	fs.StringVar(&c.plot, "plot", "", "the picture to draw, .png or .svg (default: FILE with .png for .jsonl)")
}

// cmdReport reads the JSON lines of a workload run (--json, with
// --interval for the curves over time), prints the results' table and
// draws the picture.
func cmdReport(_ context.Context, c *config) error {
	f, err := os.Open(c.input)
	if err != nil {
		return err
	}
	defer f.Close()
	var rs []*result
	var intervals []intervalSample
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var head struct {
			Type     string `json:"type"`
			Engine   string `json:"engine"`
			Workload string `json:"workload"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			return fmt.Errorf("%s:%d: %w", c.input, n, err)
		}
		switch {
		case head.Type == "interval":
			var smp intervalSample
			if err := json.Unmarshal(line, &smp); err != nil {
				return fmt.Errorf("%s:%d: %w", c.input, n, err)
			}
			intervals = append(intervals, smp)
		case head.Type == "result" || head.Type == "" && head.Engine != "" && head.Workload != "":
			r := &result{Jobs: 1}
			if err := json.Unmarshal(line, r); err != nil {
				return fmt.Errorf("%s:%d: %w", c.input, n, err)
			}
			rs = append(rs, r)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(rs) == 0 && len(intervals) == 0 {
		return fmt.Errorf("%s: no results or intervals (write them with tierbench … --json --interval 1s > FILE)", c.input)
	}
	if len(rs) > 0 {
		printTable(c.stdout, rs)
	}
	fmt.Fprintf(c.stdout, "\n%d results, %d intervals from %s\n", len(rs), len(intervals), c.input)
	out := c.plot
	if out == "" {
		out = strings.TrimSuffix(c.input, filepath.Ext(c.input)) + ".png"
	}
	if err := writePlot(out, intervals, rs); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "plot written to %s\n", out)
	return nil
}
