package blockstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Format constants. The layout of the header is documented byte by byte
// in the package doc; the offsets below are the single source of truth.
const (
	// HeaderSize is the size of the header in bytes. The payload starts at
	// this offset, so an O_DIRECT read of the payload into an aligned
	// buffer stays aligned; a block file is exactly HeaderSize+payload bytes.
	HeaderSize = 4096
	// FormatVersion is the header version this package writes and reads.
	FormatVersion = 1
	// PayloadSizeMax is the largest payload, in bytes (16 GiB). It bounds
	// what a corrupt size field can make a reader allocate or expect.
	PayloadSizeMax = 1 << 34
)

// Magic is the first four bytes of every block file.
const Magic = "UTBK"

// Header field offsets.
const (
	offMagic       = 0
	offVersion     = 4
	offKeySize     = 6
	offPayloadSize = 8
	offPayloadCRC  = 16
	offReserved    = 20
	offKey         = 24
	offHeaderCRC   = HeaderSize - 4 // covers hdr[0:offHeaderCRC]
)

// Header is a decoded block header.
type Header struct {
	// Version is the format version, FormatVersion.
	Version uint16
	// Key is the block's key. It aliases the buffer passed to DecodeHeader
	// and is valid only as long as that buffer is.
	Key []byte
	// PayloadSize is the payload length in bytes.
	PayloadSize int64
	// PayloadCRC is the CRC32C of the payload.
	PayloadCRC uint32
}

// FileSize is the exact size of the block file this header describes.
func (h Header) FileSize() int64 { return HeaderSize + h.PayloadSize }

// EncodeHeader fills hdr[:HeaderSize] with the header of a block holding
// payload under key, computing the payload's CRC32C. It does not allocate.
// It panics if hdr is shorter than HeaderSize, the key is invalid or the
// payload is larger than PayloadSizeMax: callers validate those first.
func EncodeHeader(hdr, key, payload []byte) {
	EncodeHeaderSum(hdr, key, int64(len(payload)), Checksum(payload))
}

// EncodeHeaderSum is EncodeHeader for a caller that has already computed
// the payload's size and CRC32C (for example with UpdateChecksum while
// the payload streamed in). It does not allocate.
func EncodeHeaderSum(hdr, key []byte, payloadSize int64, payloadCRC uint32) {
	if len(hdr) < HeaderSize {
		panic(fmt.Sprintf("blockstore: EncodeHeader: buffer is %d bytes, need %d", len(hdr), HeaderSize))
	}
	if len(key) < KeySizeMin || len(key) > KeySizeMax {
		panic(fmt.Sprintf("blockstore: EncodeHeader: key is %d bytes", len(key)))
	}
	if payloadSize < 0 || payloadSize > PayloadSizeMax {
		panic(fmt.Sprintf("blockstore: EncodeHeader: payload is %d bytes", payloadSize))
	}
	hdr = hdr[:HeaderSize]
	clear(hdr)
	copy(hdr[offMagic:], Magic)
	binary.LittleEndian.PutUint16(hdr[offVersion:], FormatVersion)
	binary.LittleEndian.PutUint16(hdr[offKeySize:], uint16(len(key)))
	binary.LittleEndian.PutUint64(hdr[offPayloadSize:], uint64(payloadSize))
	binary.LittleEndian.PutUint32(hdr[offPayloadCRC:], payloadCRC)
	copy(hdr[offKey:], key)
	binary.LittleEndian.PutUint32(hdr[offHeaderCRC:], Checksum(hdr[:offHeaderCRC]))
}

// DecodeHeader decodes and verifies the header in hdr[:HeaderSize]. Any
// failure wraps ErrCorrupt and names the field. The returned Key aliases
// hdr. It does not allocate on success.
//
// The checks run in an order that gives the most useful message: magic
// first (not a block file at all), then version (a newer format whose
// header checksum may be laid out differently), then the header checksum,
// then the fields' ranges.
func DecodeHeader(hdr []byte) (Header, error) {
	if len(hdr) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header is %d bytes, want %d", ErrCorrupt, len(hdr), HeaderSize)
	}
	hdr = hdr[:HeaderSize]
	if string(hdr[offMagic:offMagic+len(Magic)]) != Magic {
		return Header{}, fmt.Errorf("%w: magic is %q, want %q", ErrCorrupt, hdr[offMagic:offMagic+len(Magic)], Magic)
	}
	h := Header{Version: binary.LittleEndian.Uint16(hdr[offVersion:])}
	if h.Version != FormatVersion {
		return Header{}, fmt.Errorf("%w: version is %d, want %d", ErrCorrupt, h.Version, FormatVersion)
	}
	if got, want := Checksum(hdr[:offHeaderCRC]), binary.LittleEndian.Uint32(hdr[offHeaderCRC:]); got != want {
		return Header{}, fmt.Errorf("%w: header checksum is %#08x, header says %#08x", ErrCorrupt, got, want)
	}
	keySize := int(binary.LittleEndian.Uint16(hdr[offKeySize:]))
	if keySize < KeySizeMin || keySize > KeySizeMax {
		return Header{}, fmt.Errorf("%w: key size is %d, want %d to %d", ErrCorrupt, keySize, KeySizeMin, KeySizeMax)
	}
	size := binary.LittleEndian.Uint64(hdr[offPayloadSize:])
	if size > PayloadSizeMax {
		return Header{}, fmt.Errorf("%w: payload size is %d, more than %d", ErrCorrupt, size, PayloadSizeMax)
	}
	if r := binary.LittleEndian.Uint32(hdr[offReserved:]); r != 0 {
		return Header{}, fmt.Errorf("%w: reserved field is %#x, want 0", ErrCorrupt, r)
	}
	h.Key = hdr[offKey : offKey+keySize : offKey+keySize]
	h.PayloadSize = int64(size)
	h.PayloadCRC = binary.LittleEndian.Uint32(hdr[offPayloadCRC:])
	return h, nil
}

// CheckBlock is the one rule for a valid block file, which every reader
// applies (Get, Verify, and both of the tier's engines): its first
// HeaderSize bytes are a valid header naming key, the file is exactly
// HeaderSize+PayloadSize bytes long (a truncated file and one with bytes
// appended are both corrupt), and the payload matches its size and CRC32C.
// hdr is what was read at offset 0 (a short file gives fewer than
// HeaderSize bytes), payload exactly the bytes read from offset HeaderSize,
// and size the file's length; a reader that learns the length by reading
// rather than fstat passes what it found (any size past HeaderSize+len(payload)
// when bytes follow the payload). Every failure wraps ErrCorrupt. It does
// not allocate on success.
func CheckBlock(key, hdr, payload []byte, size int64) error {
	return checkBlock(key, hdr, payload, size, nil)
}

// checkBlock is CheckBlock, with the payload's checksum already taken
// (*sum, over all of payload) unless sum is nil.
func checkBlock(key, hdr, payload []byte, size int64, sum *uint32) error {
	if len(hdr) < HeaderSize || size < HeaderSize {
		return fmt.Errorf("%w: file is %d bytes, shorter than the %d-byte header", ErrCorrupt, min(size, int64(len(hdr))), HeaderSize)
	}
	h, err := DecodeHeader(hdr)
	if err != nil {
		return err
	}
	return h.checkFile(key, payload, size, sum)
}

// checkFile is checkBlock after the header has been decoded.
func (h Header) checkFile(key, payload []byte, size int64, sum *uint32) error {
	if size != h.FileSize() {
		return fmt.Errorf("%w: file is %d bytes, header says %d", ErrCorrupt, size, h.FileSize())
	}
	return h.check(key, payload, sum)
}

// check is checkBlock after the header has been decoded.
func (h Header) check(key, payload []byte, sum *uint32) error {
	if !bytes.Equal(h.Key, key) {
		return fmt.Errorf("%w: key is %x, want %x", ErrCorrupt, h.Key, key)
	}
	if int64(len(payload)) != h.PayloadSize {
		return fmt.Errorf("%w: payload is %d bytes, header says %d", ErrCorrupt, len(payload), h.PayloadSize)
	}
	var got uint32
	if sum != nil {
		got = *sum
	} else {
		got = Checksum(payload)
	}
	if got != h.PayloadCRC {
		return fmt.Errorf("%w: payload checksum is %#08x, header says %#08x", ErrCorrupt, got, h.PayloadCRC)
	}
	return nil
}

// Format is how a block sits in its file, the seam beside Layout: where
// the payload starts, what a store writes before it and what makes a file
// a valid block. Programs (Config.Format), Put, Get and Verify follow it.
type Format uint8

const (
	// FormatFramed, the default: a HeaderSize-byte header that names the
	// key, the payload's size and CRC32C, then the payload (see the
	// package doc). CheckBlock is its validity rule.
	FormatFramed Format = iota
	// FormatRaw: the payload and nothing else, as vLLM's filesystem tier
	// writes its blocks. A file is a valid block exactly when it is a
	// regular file of the block size (CheckRaw); nothing in it names its
	// key or checks its bytes, so the path is all the trust there is:
	// loads open beneath the namespace directory without following any
	// symlink, and judge whatever is not a regular file corrupt. A raw
	// store skips a block that is already there, as vLLM's does.
	FormatRaw
)

// String returns "framed" or "raw".
func (f Format) String() string {
	switch f {
	case FormatFramed:
		return "framed"
	case FormatRaw:
		return "raw"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// ParseFormat parses "framed" (or "") or "raw".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "framed", "":
		return FormatFramed, nil
	case "raw":
		return FormatRaw, nil
	}
	return 0, fmt.Errorf("%w: format %q (want framed or raw)", ErrInvalidOptions, s)
}

// PayloadOffset is where the payload starts in a block file: HeaderSize
// in the framed format, 0 in the raw one.
func (f Format) PayloadOffset() int64 {
	if f == FormatRaw {
		return 0
	}
	return HeaderSize
}

// CheckRaw is the one rule for a valid raw block file, which every reader
// applies (Get, Verify, both of the tier's engines): it is exactly
// blockSize bytes long, size being its length as fstat or the reads found
// it. The caller has checked that it is a regular file. Every failure
// wraps ErrCorrupt. It does not allocate on success.
func CheckRaw(size, blockSize int64) error {
	if size != blockSize {
		return fmt.Errorf("%w: file is %d bytes, the block size is %d", ErrCorrupt, size, blockSize)
	}
	return nil
}

// CorruptAction is what a load does with a block file it judged corrupt.
type CorruptAction uint8

const (
	// CorruptDefault is the format's choice: CorruptQuarantine for
	// FormatFramed, CorruptLeave for FormatRaw (a directory shared with
	// other writers, whose files are theirs).
	CorruptDefault CorruptAction = iota
	// CorruptLeave reports the block corrupt and leaves its file alone.
	CorruptLeave
	// CorruptRemove deletes the file, as vLLM does after any failed load.
	CorruptRemove
	// CorruptQuarantine moves the file into the quarantine directory.
	CorruptQuarantine
)

// String returns "default", "leave", "remove" or "quarantine".
func (a CorruptAction) String() string {
	switch a {
	case CorruptDefault:
		return "default"
	case CorruptLeave:
		return "leave"
	case CorruptRemove:
		return "remove"
	case CorruptQuarantine:
		return "quarantine"
	}
	return fmt.Sprintf("CorruptAction(%d)", uint8(a))
}

// ParseCorruptAction parses "default" (or ""), "leave", "remove" or
// "quarantine".
func ParseCorruptAction(s string) (CorruptAction, error) {
	for a := CorruptDefault; a <= CorruptQuarantine; a++ {
		if s == a.String() || s == "" && a == CorruptDefault {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: corrupt-block action %q (want default, leave, remove or quarantine)", ErrInvalidOptions, s)
}

// Resolve returns the action in force for blocks of format f: a itself,
// or f's choice for CorruptDefault.
func (a CorruptAction) Resolve(f Format) CorruptAction {
	switch {
	case a != CorruptDefault:
		return a
	case f == FormatRaw:
		return CorruptLeave
	}
	return CorruptQuarantine
}
