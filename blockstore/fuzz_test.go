package blockstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// FuzzDecodeHeader feeds arbitrary bytes to DecodeHeader and CheckBlock:
// they must not panic, every failure must wrap ErrCorrupt, and a header
// that decodes must describe a valid key and size. The seeds (a valid
// header, and damaged copies) run in every plain `go test`.
func FuzzDecodeHeader(f *testing.F) {
	key := testKey(1, 32)
	payload := []byte("payload")
	valid := make([]byte, HeaderSize)
	EncodeHeader(valid, key, payload)
	f.Add(valid, payload)
	f.Add(valid[:HeaderSize-1], payload)
	f.Add([]byte{}, []byte{})
	f.Add(make([]byte, HeaderSize), []byte{})
	for _, off := range []int{offMagic, offVersion, offKeySize, offPayloadSize, offPayloadCRC, offReserved, offKey, offHeaderCRC} {
		bad := bytes.Clone(valid)
		bad[off] ^= 0x80
		f.Add(bad, payload)
		fixed := bytes.Clone(bad)
		binary.LittleEndian.PutUint32(fixed[offHeaderCRC:], Checksum(fixed[:offHeaderCRC]))
		f.Add(fixed, payload)
	}
	f.Fuzz(func(t *testing.T, hdr, payload []byte) {
		h, err := DecodeHeader(hdr)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %q does not wrap ErrCorrupt", err)
			}
			return
		}
		if ValidateKey(h.Key) != nil || h.PayloadSize < 0 || h.PayloadSize > PayloadSizeMax || h.Version != FormatVersion {
			t.Fatalf("decoded an invalid header: %+v", h)
		}
		// A header that decodes re-encodes to the same bytes.
		again := make([]byte, HeaderSize)
		EncodeHeaderSum(again, h.Key, h.PayloadSize, h.PayloadCRC)
		if !bytes.Equal(again, hdr[:HeaderSize]) {
			t.Fatalf("header does not re-encode identically")
		}
		if err := CheckBlock(h.Key, hdr, payload, HeaderSize+int64(len(payload))); err == nil &&
			(int64(len(payload)) != h.PayloadSize || Checksum(payload) != h.PayloadCRC) {
			t.Fatalf("CheckBlock accepted a payload that does not match its header")
		}
	})
}

// FuzzKeyFromPath parses arbitrary relative paths: whatever parses must be
// a valid key whose path is exactly the input.
func FuzzKeyFromPath(f *testing.F) {
	var l FanoutLayout
	for _, s := range []string{
		string(l.AppendPath(nil, testKey(1, 8))), string(l.AppendPath(nil, testKey(2, 64))),
		string(l.AppendTempPath(nil, testKey(3, 32), 7)),
		"", "../../etc/passwd", "01/02/0102030405060708.blk", "01/02/../0102030405060708.blk",
		"01/02/0102030405060708.blk\x00", "01/02/0102030405060708.BLK", "/01/02/0102030405060708.blk",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		key, ok := l.KeyFromPath(rel)
		if ok {
			if err := ValidateKey(key); err != nil {
				t.Fatalf("KeyFromPath(%q) returned an invalid key: %v", rel, err)
			}
			if got := string(l.AppendPath(nil, key)); got != rel {
				t.Fatalf("KeyFromPath(%q) = %x, whose path is %q", rel, key, got)
			}
			if l.IsTempPath(rel) {
				t.Fatalf("%q is both a block and a temporary file", rel)
			}
		}
	})
}

// FuzzKey checks that every valid key maps to a path of plain hex
// components that parses back to it, and that namespaces that validate
// are a single safe path component.
func FuzzKey(f *testing.F) {
	f.Add([]byte("12345678"), "ns")
	f.Add([]byte("../../\x00/etc"), "..")
	f.Add([]byte{}, "")
	f.Add(bytes.Repeat([]byte{0xff}, 65), "a/b")
	f.Add(bytes.Repeat([]byte{0}, 64), ".x")
	f.Fuzz(func(t *testing.T, key []byte, ns string) {
		var l FanoutLayout
		if ValidateKey(key) == nil {
			rel := string(l.AppendPath(nil, key))
			for _, part := range strings.Split(rel, "/") {
				if part == "" || part == "." || part == ".." {
					t.Fatalf("path %q has component %q", rel, part)
				}
			}
			got, ok := l.KeyFromPath(rel)
			if !ok || !bytes.Equal(got, key) {
				t.Fatalf("key %x: path %q parses to %x, %v", key, rel, got, ok)
			}
		} else if len(key) >= KeySizeMin && len(key) <= KeySizeMax {
			t.Fatalf("key of %d bytes rejected", len(key))
		}
		if ValidateNamespace(ns) == nil {
			if ns == "." || ns == ".." || strings.ContainsAny(ns, "/\x00") || len(ns) > NamespaceSizeMax {
				t.Fatalf("namespace %q accepted", ns)
			}
		}
	})
}
