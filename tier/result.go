package tier

// Op is the kind of a request.
type Op uint8

// Request kinds.
const (
	OpLookup  Op = iota + 1 // which keys exist
	OpLoad                  // read blocks into the caller's buffers
	OpStore                 // write blocks from the caller's buffers
	OpRelease               // the kernel has let go of a request's held buffers
	OpDelete                // remove blocks
)

var opNames = [...]string{OpLookup: "lookup", OpLoad: "load", OpStore: "store", OpRelease: "release", OpDelete: "delete"}

// String returns "lookup", "load", "store", "release" or "delete".
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "op?"
}

// Status is the outcome of one key.
type Status uint8

// Key outcomes. Found, Loaded, Stored, Present and Deleted are successes;
// the rest are not.
const (
	StatusPending  Status = iota // no outcome yet (never seen in a Result)
	StatusFound                  // lookup: the block exists
	StatusLoaded                 // load: the payload is in the caller's buffer, checksum verified
	StatusStored                 // store: the block was published
	StatusPresent                // store: the block was already there; nothing written
	StatusMissing                // lookup or load: no such block
	StatusCorrupt                // load: the file failed verification; Err says how
	StatusTimedOut               // the deadline passed (Err: ErrTimeout or ErrBreakerOpen)
	StatusFailed                 // an IO error; Err is an *fs.PathError
	StatusCanceled               // Cancel or Close ended it first
	StatusSkipped                // prefix-only lookup: after a miss, not looked up
	StatusDeleted                // delete: the block was removed (a delete of no block: StatusMissing)
	// StatusFull: store: refused before writing, because the tier cannot
	// make room (Options.Capacity: every block is younger than
	// EvictMinAge, or the filesystem is full of other files), or the
	// filesystem ran out of space (ENOSPC, EDQUOT: Err says so) and the
	// temporary file was removed. Nothing of the block is left behind.
	StatusFull
)

var statusNames = [...]string{"pending", "found", "loaded", "stored", "present", "missing", "corrupt", "timed-out", "failed", "canceled", "skipped", "deleted", "full"}

// String returns the status's name.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "status?"
}

// OK reports whether s is a success.
func (s Status) OK() bool { return s >= StatusFound && s <= StatusPresent || s == StatusDeleted }

// KeyResult is the outcome of one key of a request.
type KeyResult struct {
	Status Status
	Err    error // why, for Corrupt, TimedOut, Failed and Canceled; nil otherwise
}

// Result is a finished request. Poll fills Results the caller owns: Keys
// reuses the capacity already in the caller's Result, so a caller that
// reuses its slice of Results allocates nothing in steady state.
type Result struct {
	Req    uint64      // the caller's request ID
	Op     Op          // what the request did
	Keys   []KeyResult // one per key, in the order submitted
	Prefix int         // how many leading keys succeeded: the prefix hit
	// Held counts the request's buffers that the kernel may still write
	// or read (a load or store that timed out in a hung filesystem). The
	// caller must not reuse them until a Result with Op == OpRelease and
	// the same Req arrives; none arrives for a load or store the kernel
	// took before its ring broke (ErrBroken), since a broken ring never
	// says when the kernel lets go. Zero almost always.
	Held int
}
