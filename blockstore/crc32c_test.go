package blockstore

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestChecksumMatchesHashCRC32 compares Checksum and UpdateChecksum with
// hash/crc32's CRC-32C over every length to 2 KiB and some longer ones,
// each at a random start offset and cut in two at a random place.
func TestChecksumMatchesHashCRC32(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 3<<20)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	want := func(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }
	lengths := []int{1 << 20, 2<<20 + 4096 - 4, 3<<20 - 64}
	for n := range 2049 {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		off := rng.IntN(64)
		if off+n > len(buf) {
			off = len(buf) - n
		}
		b := buf[off : off+n]
		require.Equal(t, want(b), Checksum(b), "%d bytes at offset %d", n, off)
		cut := rng.IntN(n + 1)
		require.Equal(t, want(b), UpdateChecksum(UpdateChecksum(0, b[:cut]), b[cut:]), "%d bytes cut at %d", n, cut)
	}
	// A single flipped bit anywhere changes it.
	b := buf[:4096]
	sum := Checksum(b)
	for _, bit := range []int{0, 31, 32, 511, 512, 2047, 2048, 4096*8 - 1} {
		b[bit/8] ^= 1 << (bit % 8)
		require.NotEqual(t, sum, Checksum(b), "bit %d flipped", bit)
		b[bit/8] ^= 1 << (bit % 8)
	}
}

// TestFoldConstMatchesIEEEs: foldConst gives the constants of Intel's
// paper for CRC-32 (IEEE), which hash/crc32's own folding uses.
func TestFoldConstMatchesIEEEs(t *testing.T) {
	for e, want := range map[int]uint64{512 + 32: 0x154442bd4, 512 - 32: 0x1c6e41596, 128 + 32: 0x1751997d0, 128 - 32: 0x0ccaa009e, 64: 0x163cd6124} {
		require.Equal(t, want, foldConst(crc32.IEEE, e), "x^%d", e)
	}
}

// BenchmarkChecksum is Checksum against hash/crc32's CRC-32C over 2 MiB
// payloads, one buffer (in the cache) and 64 in turn (128 MiB, not).
func BenchmarkChecksum(b *testing.B) {
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, 2<<20)
		for j := range bufs[i] {
			bufs[i][j] = byte(j*7 + i)
		}
	}
	tab := crc32.MakeTable(crc32.Castagnoli)
	for _, c := range []struct {
		name string
		sum  func([]byte) uint32
	}{{"blockstore", Checksum}, {"hash-crc32", func(p []byte) uint32 { return crc32.Checksum(p, tab) }}} {
		for _, n := range []int{1, 64} {
			b.Run(c.name+map[int]string{1: "/cached", 64: "/uncached"}[n], func(b *testing.B) {
				b.SetBytes(2 << 20)
				i := 0
				for b.Loop() {
					c.sum(bufs[i%n])
					i++
				}
			})
		}
	}
}
