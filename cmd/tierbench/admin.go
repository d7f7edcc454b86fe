package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/uringtier/uringtier/blockstore"
)

// openStore opens the block store at --dir, which must exist: maintenance
// never creates a directory. Raw blocks are judged by --block-size, or the
// data set's (from populate) when not given.
func openStore(c *config) (*blockstore.Store, error) {
	fi, err := os.Stat(c.dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", c.dir)
	}
	format, _ := c.blockFormat() // validated
	opts := blockstore.Options{Layout: c.blockLayout(), Format: format}
	if format == blockstore.FormatRaw {
		opts.BlockSize = int64(c.blockSize)
		if m, err := readManifest(c.dir, c.dataSet()); opts.BlockSize == 0 && c.namespace != "" && err == nil {
			opts.BlockSize = int64(m.BlockSize)
		}
	}
	return blockstore.Open(c.dir, opts)
}

func printJSON(c *config, v any) error {
	return json.NewEncoder(c.stdout).Encode(v)
}
