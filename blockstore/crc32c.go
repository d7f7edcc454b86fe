package blockstore

import (
	"hash/crc32"
	"math/bits"
)

// castagnoli is built once: crc32.MakeTable allocates, and with SSE4.2 the
// Castagnoli polynomial is computed in hardware.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC32C (Castagnoli) of b, the checksum used for both
// the payload and the header. It does not allocate.
func Checksum(b []byte) uint32 { return updateCRC(0, b) }

// UpdateChecksum extends a CRC32C computed over earlier bytes with b, for
// callers that see a payload in pieces. UpdateChecksum(0, b) == Checksum(b).
func UpdateChecksum(crc uint32, b []byte) uint32 { return updateCRC(crc, b) }

// Folding constants for a carry-less multiplication CRC (Intel, "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ Instruction"): a
// 128-bit piece of the message d bits ahead of where it is added in is
// multiplied, its first 64 bits by x^(d+32) and its last by x^(d-32)
// modulo the polynomial. foldConsts holds those pairs for d = 2,048 (four
// 512-bit registers), 512 (one) and 128 (one 128-bit lane into the next).
var foldConsts = [6]uint64{
	foldConst(crc32.Castagnoli, 2048+32), foldConst(crc32.Castagnoli, 2048-32),
	foldConst(crc32.Castagnoli, 512+32), foldConst(crc32.Castagnoli, 512-32),
	foldConst(crc32.Castagnoli, 128+32), foldConst(crc32.Castagnoli, 128-32),
}

// foldConst returns x^e modulo the CRC polynomial whose bit-reflected form
// is reversed (as hash/crc32 names them), itself bit-reflected and shifted
// left by one, which is how a carry-less multiplication of reflected
// operands wants it.
func foldConst(reversed uint32, e int) uint64 {
	poly := bits.Reverse32(reversed) // x^32 implied
	r := uint32(1)
	for range e {
		top := r >> 31
		r <<= 1
		if top != 0 {
			r ^= poly
		}
	}
	return uint64(bits.Reverse32(r)) << 1
}
