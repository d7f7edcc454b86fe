package tier

import "github.com/uringtier/uringtier/blockstore"

// What both engines share to run blockstore's programs.

// programOp maps a tier operation to the program that does it.
var programOp = [...]blockstore.Op{OpLookup: blockstore.OpLookup, OpLoad: blockstore.OpLoad, OpStore: blockstore.OpStore, OpDelete: blockstore.OpDelete}

// tierStatus maps a program's outcome to a key's status.
var tierStatus = [...]Status{
	blockstore.StatusPending: StatusPending,
	blockstore.StatusFound:   StatusFound,
	blockstore.StatusMissing: StatusMissing,
	blockstore.StatusLoaded:  StatusLoaded,
	blockstore.StatusStored:  StatusStored,
	blockstore.StatusCorrupt: StatusCorrupt,
	blockstore.StatusFailed:  StatusFailed,
	blockstore.StatusPresent: StatusPresent,
	blockstore.StatusDeleted: StatusDeleted,
}

// programConfig is the configuration of the tier's programs, with dirs
// remembering which directories exist and a guess of its own whether
// those not seen yet are there.
func (t *Tier) programConfig(dirs blockstore.DirCache) blockstore.Config {
	var parts int
	if t.local {
		parts = sumChunk
	}
	return blockstore.Config{
		Layout:     t.store.Layout(),
		Format:     t.opts.Format,
		Durability: t.opts.Durability,
		Corrupt:    t.opts.OnCorrupt.Resolve(t.opts.Format),
		Dir:        t.nsDir,
		Quarantine: t.qDir,
		Namespace:  t.opts.Namespace,
		Dirs:       dirs,
		Guess:      new(blockstore.DirGuess),
		SumChunk:   parts,
	}
}

// sumChunk is Config.SumChunk on a local filesystem: a page-cache load
// of a bigger framed block reads its payload 256 KiB a phase and
// checksums each part while the copy has left it in the CPU's cache.
// Reads of a 2 MiB file in the page cache, each part checksummed
// (blockstore.UpdateChecksum) before the next read, one goroutine, the
// ways in turn (docs/performance.md, eleventh sitting): 1.18-1.23x the
// bytes a second of one read and one checksum, with pread and with
// io_uring READ alike. Not on FUSE or network filesystems, where a read
// is a round trip to the server and parts would make several in a row.
// A variable so that tests can make small blocks span many parts.
var sumChunk = 256 << 10

// quarantines reports whether loads move corrupt blocks into the
// quarantine directory, which then must exist.
func (t *Tier) quarantines() bool {
	return t.opts.OnCorrupt.Resolve(t.opts.Format) == blockstore.CorruptQuarantine
}

// noteDisposal counts and logs what a decided load p did with a corrupt
// block file, if anything. Safe from any goroutine.
func (t *Tier) noteDisposal(p *blockstore.Program) {
	if d, ok := p.Disposed(); ok {
		t.noteDisposed(d, p.Err)
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
