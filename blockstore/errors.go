package blockstore

import "errors"

// Sentinel errors. Every error the package returns that is not an IO error
// from the kernel wraps one of these, so callers test with errors.Is.
// A missing block is reported as an *fs.PathError wrapping ENOENT, so
// errors.Is(err, fs.ErrNotExist) holds, as it does for package os.
var (
	// ErrCorrupt marks a block file that is short, truncated, mis-keyed or
	// fails a checksum; the wrapping message names the field that was wrong.
	ErrCorrupt = errors.New("blockstore: corrupt block")
	// ErrInvalidKey marks a key shorter than KeySizeMin or longer than KeySizeMax.
	ErrInvalidKey = errors.New("blockstore: invalid key")
	// ErrInvalidNamespace marks a namespace outside [A-Za-z0-9._-]{1,128}, or "." or "..".
	ErrInvalidNamespace = errors.New("blockstore: invalid namespace")
	// ErrBufferSize marks a caller's buffer too small for the block's payload.
	ErrBufferSize = errors.New("blockstore: buffer too small for block")
	// ErrPayloadSize marks a payload larger than PayloadSizeMax.
	ErrPayloadSize = errors.New("blockstore: payload too large")
	// ErrInvalidOptions marks Options that Open rejects.
	ErrInvalidOptions = errors.New("blockstore: invalid options")
)
