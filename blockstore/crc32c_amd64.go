package blockstore

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

// foldCRC is the raw CRC-32C state (not inverted) after the state crc and
// p, whose length is a multiple of 64 and at least 64, folded with
// VPCLMULQDQ on 512-bit registers (crc32c_amd64.s).
//
//go:noescape
func foldCRC(crc uint32, p []byte, k *[6]uint64) uint32

// canFold says whether this CPU (and its OS) runs foldCRC.
var canFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// foldMin is the shortest input that foldCRC takes; shorter ones, and
// what is left past the last 64 bytes, go to hash/crc32.
const foldMin = 256

// updateCRC extends crc (as hash/crc32.Update) with p. hash/crc32's
// CRC-32C on amd64 is the CRC32 instruction, three streams at a time: 26
// GB/s over a 2 MiB buffer in the cache here, but 10.4 GB/s over ones
// that are not, where a store's or a load's payload usually is; folding
// 256 bytes a step with VPCLMULQDQ keeps more loads in flight.
// (BenchmarkChecksum in this package against hash/crc32.)
func updateCRC(crc uint32, p []byte) uint32 {
	if !canFold || len(p) < foldMin {
		return crc32.Update(crc, castagnoli, p)
	}
	n := len(p) &^ 63
	crc = ^foldCRC(^crc, p[:n], &foldConsts)
	return crc32.Update(crc, castagnoli, p[n:])
}
