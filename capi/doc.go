// Command capi is liburingtier, the tier's C ABI: built with
//
//	go build -buildmode=c-shared -o liburingtier.so ./capi
//
// it exports the functions declared in uringtier.h, for C programs and for
// the Python package in python/uringtier, which calls them through ctypes.
//
// # Layers
//
// shim.c holds the exported C functions. Each checks that the process was
// not forked after the library was loaded (a Go runtime does not survive
// fork: a child calling into it could hang) and only then calls the Go
// function of the same name with the prefix utgo_, in capi.go. Those
// translate between C memory and the tier's public Go API (tier.Tier) and
// map Go errors to the header's codes, recording the message per thread for
// ut_last_error.
//
// # Memory
//
// No Go pointer crosses the boundary: a tier is an integer handle into a
// table (handles.go), results and JSON are copied into the caller's arrays.
// Keys are copied by the tier at submit. Buffers of loads and stores are
// the caller's C memory, seen from Go as slices (unsafe.Slice); the tier
// holds them until the result is polled, as the Go API says, so the caller
// must keep them allocated until then (the header's Memory section). The
// tier's own buffers (ut_open_buffers) are laid out in C memory too
// (tier.Options.BufferMemory): ut_buffers hands out addresses into the
// caller's memory, never the library's.
//
// # Threads
//
// Every exported function may be called from any thread. Per tier, one
// goroutine turns the tier's Ready channel into writes to an eventfd
// (ut_fd), so that a foreign event loop can wait for results. ut_exists
// runs on a fixed pool of goroutines (exists.go), independent of tiers.
package main

func main() {} // required by -buildmode=c-shared; never runs
