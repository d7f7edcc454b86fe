package tier

import "github.com/uringtier/uringtier/blockstore"

// What both engines share to run blockstore's programs.

// programOp maps a tier operation to the program that does it.
var programOp = [...]blockstore.Op{OpLookup: blockstore.OpLookup, OpLoad: blockstore.OpLoad, OpStore: blockstore.OpStore}

// tierStatus maps a program's outcome to a key's status.
var tierStatus = [...]Status{
	blockstore.StatusPending: StatusPending,
	blockstore.StatusFound:   StatusFound,
	blockstore.StatusMissing: StatusMissing,
	blockstore.StatusLoaded:  StatusLoaded,
	blockstore.StatusStored:  StatusStored,
	blockstore.StatusCorrupt: StatusCorrupt,
	blockstore.StatusFailed:  StatusFailed,
}

// programConfig is the configuration of the tier's programs, with dirs
// remembering which directories exist.
func (t *Tier) programConfig(dirs blockstore.DirCache) blockstore.Config {
	return blockstore.Config{
		Layout:     t.store.Layout(),
		Durability: t.opts.Durability,
		Dir:        t.nsDir,
		Quarantine: t.qDir,
		Namespace:  t.opts.Namespace,
		Dirs:       dirs,
	}
}

// dirSet is a DirCache for one goroutine: an io_uring shard's owner.
type dirSet map[string]struct{}

func (d dirSet) Known(dir []byte) bool { _, ok := d[string(dir)]; return ok }
func (d dirSet) Remember(dir []byte) {
	if !d.Known(dir) {
		d[string(dir)] = struct{}{} // the one allocation, per new directory
	}
}
func (d dirSet) Forget(dir []byte) { delete(d, string(dir)) }
