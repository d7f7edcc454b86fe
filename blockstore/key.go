package blockstore

import "fmt"

// Limits on keys and namespaces.
const (
	// KeySizeMin is the shortest key, in bytes. Keys are block hashes;
	// anything shorter would collide.
	KeySizeMin = 8
	// KeySizeMax is the longest key, in bytes (a SHA-512 digest).
	KeySizeMax = 64
	// NamespaceSizeMax is the longest namespace, in bytes.
	NamespaceSizeMax = 128
)

// ValidateKey reports whether key is a valid block key: 8 to 64 opaque
// bytes. Its file name is its lowercase hex, so any byte value is safe.
// It does not allocate when the key is valid, and is small enough to be
// inlined: the tier checks each of a batch's keys in the caller's call.
func ValidateKey(key []byte) error {
	if len(key) < KeySizeMin || len(key) > KeySizeMax {
		return keySizeError(len(key))
	}
	return nil
}

func keySizeError(n int) error {
	return fmt.Errorf("%w: %d bytes, want %d to %d", ErrInvalidKey, n, KeySizeMin, KeySizeMax)
}

// ValidateNamespace reports whether ns is a valid namespace: 1 to 128
// characters from [A-Za-z0-9._-], and not "." or "..". Such a name is a
// single path component that stays inside the store's root.
// It does not allocate when the namespace is valid.
func ValidateNamespace(ns string) error {
	if len(ns) == 0 || len(ns) > NamespaceSizeMax {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidNamespace, len(ns), NamespaceSizeMax)
	}
	if ns == "." || ns == ".." {
		return fmt.Errorf("%w: %q", ErrInvalidNamespace, ns)
	}
	for i := 0; i < len(ns); i++ {
		if !namespaceByte(ns[i]) {
			return fmt.Errorf("%w: byte %#02x at offset %d in %q", ErrInvalidNamespace, ns[i], i, ns)
		}
	}
	return nil
}

func namespaceByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

const hexDigits = "0123456789abcdef"

// appendHex appends the lowercase hex of b to dst.
func appendHex(dst, b []byte) []byte {
	for _, c := range b {
		dst = append(dst, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return dst
}

// unhex is the value of a lowercase hex digit, or -1. Upper case is
// rejected so that every key has exactly one file name.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}

// decodeHex decodes lowercase hex s into a new slice, or reports false.
func decodeHex(s string) ([]byte, bool) {
	if len(s)%2 != 0 {
		return nil, false
	}
	out := make([]byte, len(s)/2)
	for i := range out {
		hi, lo := unhex(s[2*i]), unhex(s[2*i+1])
		if hi < 0 || lo < 0 {
			return nil, false
		}
		out[i] = byte(hi<<4 | lo)
	}
	return out, true
}
