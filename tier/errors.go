package tier

import "errors"

// Errors returned by the submit calls, Open and Close. Per-key failures are
// reported in Result, not here.
var (
	// ErrBusy means the configured depth is full: the caller polls and
	// retries later. Nothing was queued.
	ErrBusy = errors.New("tier: busy, depth full")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("tier: closed")
	// ErrInvalid marks a request the tier refuses: a bad key, a buffer of
	// the wrong size, too many keys, a request ID already in flight. The
	// wrapping message says which.
	ErrInvalid = errors.New("tier: invalid request")
	// ErrInvalidOptions marks Options that Open rejects.
	ErrInvalidOptions = errors.New("tier: invalid options")
	// ErrTimeout is the Err of a key that reached its deadline.
	ErrTimeout = errors.New("tier: deadline exceeded")
	// ErrBreakerOpen is the Err of a key failed fast because too many
	// operations are stuck in the filesystem.
	ErrBreakerOpen = errors.New("tier: circuit breaker open, filesystem not answering")
	// ErrCanceled is the Err of a key canceled by Cancel or Close.
	ErrCanceled = errors.New("tier: canceled")
	// ErrFull is the Err of a store refused before writing (StatusFull):
	// the namespace is at Options.Capacity and the evictor cannot make
	// room yet, or the filesystem reported no space.
	ErrFull = errors.New("tier: full: no room for the block")
	// ErrNotEvictor is returned by EvictNow when another tier (another
	// process or host) holds the directory's eviction lease; the error
	// names it.
	ErrNotEvictor = errors.New("tier: another tier evicts this directory")
	// ErrStuck is wrapped by Close's error when operations are still held
	// by the filesystem at the context's deadline.
	ErrStuck = errors.New("tier: operations stuck in the filesystem")
	// ErrBroken is wrapped by every error of a tier whose engine failed
	// (an io_uring instance the kernel stopped accepting): keys in flight
	// and later submits get it, with the cause (buffers the kernel may
	// still use stay held: Result.Held). Reopen the tier.
	ErrBroken = errors.New("tier: engine broken")
)
