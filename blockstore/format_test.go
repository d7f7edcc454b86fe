package blockstore

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKey returns a deterministic key of size bytes for index i.
func testKey(i, size int) []byte {
	k := make([]byte, size)
	binary.LittleEndian.PutUint64(k, uint64(i)*0x9e3779b97f4a7c15+1)
	for j := 8; j < size; j++ {
		k[j] = byte(i + j)
	}
	return k
}

// testPayload returns n bytes derived from key, so that every writer of a
// key writes identical content, as with content-addressed blocks.
func testPayload(key []byte, n int) []byte {
	rng := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(key), uint64(n)))
	p := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(p[i:], rng.Uint64())
	}
	for i := n &^ 7; i < n; i++ {
		p[i] = byte(rng.Uint32())
	}
	return p
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, keySize := range []int{KeySizeMin, 32, KeySizeMax} {
		for _, n := range []int{0, 1, 4095, 4096, 1 << 20} {
			t.Run(fmt.Sprintf("key=%d/payload=%d", keySize, n), func(t *testing.T) {
				key := testKey(n, keySize)
				payload := testPayload(key, n)
				hdr := make([]byte, HeaderSize)
				EncodeHeader(hdr, key, payload)
				h, err := DecodeHeader(hdr)
				require.NoError(t, err)
				assert.Equal(t, uint16(FormatVersion), h.Version)
				assert.Equal(t, key, h.Key)
				assert.Equal(t, int64(n), h.PayloadSize)
				assert.Equal(t, Checksum(payload), h.PayloadCRC)
				assert.Equal(t, int64(HeaderSize+n), h.FileSize())
				require.NoError(t, CheckBlock(key, hdr, payload, HeaderSize+int64(len(payload))))
			})
		}
	}
}

// TestHeaderCorruption flips every header field in turn. With fix set the
// header checksum is recomputed afterwards, so the field's own check must
// catch it; without, the header checksum (or an earlier check) must.
func TestHeaderCorruption(t *testing.T) {
	key := testKey(7, 32)
	payload := testPayload(key, 1000)
	cases := []struct {
		name string
		off  int
		val  byte // XORed into hdr[off]
		fix  bool
		want string
	}{
		{"magic", offMagic, 0xff, false, "magic"},
		{"version", offVersion, 0x01, false, "version"},
		{"version-fixed", offVersion, 0x01, true, "version"},
		{"key-size", offKeySize, 0x01, false, "header checksum"},
		{"key-size-short", offKeySize, 0x20 ^ 0x07, true, "key size is 7"},
		{"key-size-long", offKeySize + 1, 0x01, true, "key size is 288"},
		{"payload-size", offPayloadSize, 0x01, false, "header checksum"},
		{"payload-size-fixed", offPayloadSize, 0x01, true, "file is 5096 bytes, header says 5097"},
		{"payload-size-huge", offPayloadSize + 7, 0x01, true, "payload size is"},
		{"payload-crc", offPayloadCRC, 0x01, false, "header checksum"},
		{"payload-crc-fixed", offPayloadCRC + 3, 0x80, true, "payload checksum"},
		{"reserved", offReserved, 0x01, false, "header checksum"},
		{"reserved-fixed", offReserved, 0x01, true, "reserved field"},
		{"key", offKey + 5, 0x01, false, "header checksum"},
		{"key-fixed", offKey + 5, 0x01, true, "key is"},
		{"padding", 1000, 0x01, false, "header checksum"},
		{"header-crc", offHeaderCRC, 0x01, false, "header checksum"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := make([]byte, HeaderSize)
			EncodeHeader(hdr, key, payload)
			hdr[c.off] ^= c.val
			if c.fix {
				binary.LittleEndian.PutUint32(hdr[offHeaderCRC:], Checksum(hdr[:offHeaderCRC]))
			}
			err := CheckBlock(key, hdr, payload, HeaderSize+int64(len(payload)))
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	t.Run("payload-byte", func(t *testing.T) {
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, key, payload)
		for i := range payload {
			p := append([]byte(nil), payload...)
			p[i] ^= 1 << (i % 8)
			err := CheckBlock(key, hdr, p, HeaderSize+int64(len(p)))
			require.ErrorIs(t, err, ErrCorrupt, "byte %d", i)
			require.Contains(t, err.Error(), "payload checksum")
		}
	})
	t.Run("short-header", func(t *testing.T) {
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, key, payload)
		_, err := DecodeHeader(hdr[:HeaderSize-1])
		require.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), "header is 4095 bytes")
	})
	t.Run("truncated-payload", func(t *testing.T) {
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, key, payload)
		err := CheckBlock(key, hdr, payload[:999], HeaderSize+999)
		require.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), fmt.Sprintf("file is %d bytes, header says %d", HeaderSize+999, HeaderSize+len(payload)))
	})
	t.Run("appended", func(t *testing.T) {
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, key, payload)
		err := CheckBlock(key, hdr, payload, HeaderSize+int64(len(payload))+1)
		require.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), fmt.Sprintf("file is %d bytes, header says %d", HeaderSize+len(payload)+1, HeaderSize+len(payload)))
	})
	t.Run("short-file", func(t *testing.T) {
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, key, payload)
		err := CheckBlock(key, hdr[:100], nil, 100)
		require.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), "file is 100 bytes, shorter than the 4096-byte header")
	})
	t.Run("other-key", func(t *testing.T) {
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, key, payload)
		err := CheckBlock(testKey(8, 32), hdr, payload, HeaderSize+int64(len(payload)))
		require.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), "key is")
	})
}

func TestEncodeHeaderPanics(t *testing.T) {
	key := testKey(1, 16)
	assert.Panics(t, func() { EncodeHeader(make([]byte, HeaderSize-1), key, nil) })
	assert.Panics(t, func() { EncodeHeader(make([]byte, HeaderSize), key[:7], nil) })
	assert.Panics(t, func() { EncodeHeaderSum(make([]byte, HeaderSize), key, PayloadSizeMax+1, 0) })
}

func TestUpdateChecksum(t *testing.T) {
	p := testPayload(testKey(3, 8), 10000)
	assert.Equal(t, Checksum(p), UpdateChecksum(UpdateChecksum(0, p[:3333]), p[3333:]))
}

// TestFormatNoAllocs guards the pieces the io_uring tier calls per block.
func TestFormatNoAllocs(t *testing.T) {
	key := testKey(1, 32)
	payload := testPayload(key, 64<<10)
	hdr := make([]byte, HeaderSize)
	var l FanoutLayout
	path := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(100, func() {
		EncodeHeader(hdr, key, payload)
		if err := CheckBlock(key, hdr, payload, HeaderSize+int64(len(payload))); err != nil {
			panic(err)
		}
		if _, err := DecodeHeader(hdr); err != nil {
			panic(err)
		}
		if ValidateKey(key) != nil || ValidateNamespace("model-a_tp4.v1") != nil {
			panic("invalid")
		}
		path = l.AppendPath(path[:0], key)
		path = l.AppendDir(path[:0], key)
		path = l.AppendTempPath(path[:0], key, NewTempToken())
	})
	assert.Zero(t, allocs)
}
