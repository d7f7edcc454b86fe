package blockstore

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateKey(t *testing.T) {
	for n := 0; n <= 70; n++ {
		err := ValidateKey(make([]byte, n))
		if n >= KeySizeMin && n <= KeySizeMax {
			assert.NoError(t, err, "size %d", n)
		} else {
			assert.ErrorIs(t, err, ErrInvalidKey, "size %d", n)
		}
	}
	// Separators, dots and NUL are just bytes: they become hex.
	key := []byte("../../\x00/etc/passwd")
	require.NoError(t, ValidateKey(key))
	p := string(FanoutLayout{}.AppendPath(nil, key))
	assert.Equal(t, "2e/2e/2e2e2f2e2e2f002f6574632f706173737764.blk", p)
	assert.NotContains(t, p, "..")
}

func TestValidateNamespace(t *testing.T) {
	good := []string{"a", "model-7b_tp2.pp1", "A.B", ".hidden", "..x", strings.Repeat("z", NamespaceSizeMax)}
	for _, ns := range good {
		assert.NoError(t, ValidateNamespace(ns), "%q", ns)
	}
	bad := []string{"", ".", "..", "a/b", "/a", "a\x00b", "a b", "~quarantine", "é", "a\\b",
		strings.Repeat("z", NamespaceSizeMax+1)}
	for _, ns := range bad {
		err := ValidateNamespace(ns)
		assert.ErrorIs(t, err, ErrInvalidNamespace, "%q", ns)
	}
}

func TestLayoutRoundTrip(t *testing.T) {
	var l FanoutLayout
	for _, size := range []int{KeySizeMin, 20, 32, KeySizeMax} {
		key := testKey(size, size)
		rel := string(l.AppendPath(nil, key))
		got, ok := l.KeyFromPath(rel)
		require.True(t, ok, rel)
		assert.Equal(t, key, got)
		assert.False(t, l.IsTempPath(rel))
		assert.Equal(t, rel[:5], string(l.AppendDir(nil, key)))

		tmp := string(l.AppendTempPath(nil, key, 42))
		assert.True(t, strings.HasPrefix(tmp, rel+".tmp."), tmp)
		assert.True(t, l.IsTempPath(tmp))
		_, ok = l.KeyFromPath(tmp)
		assert.False(t, ok)
		assert.NotEqual(t, tmp, string(l.AppendTempPath(nil, key, 43)))
	}
	for _, rel := range []string{
		"", "ab/cd", "ab/cd/", "00/00/0000000000000000.blk/x",
		"01/02/0102030405060708.BLK", "01/02/0102030405060708.blk.tmp.1.2",
		"01/03/0102030405060708.blk",  // directory does not match the name
		"01/02/01020304050607.blk",    // 7 bytes
		"01/02/01020304050607080.blk", // odd
		"01/02/0102030405060A08.blk",  // upper case
		"01/02/010203040506070g.blk",
		"x/01/02/0102030405060708.blk",
	} {
		_, ok := l.KeyFromPath(rel)
		assert.False(t, ok, "%q", rel)
	}
}
