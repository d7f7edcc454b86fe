package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/uringtier/uringtier/blockstore"
)

// openStore opens the block store at --dir, which must exist: maintenance
// never creates a directory.
func openStore(c *config) (*blockstore.Store, error) {
	fi, err := os.Stat(c.dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", c.dir)
	}
	return blockstore.Open(c.dir, blockstore.Options{})
}

func printJSON(c *config, v any) error {
	return json.NewEncoder(c.stdout).Encode(v)
}
