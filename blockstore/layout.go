package blockstore

import (
	"crypto/rand"
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

// Layout maps keys to paths relative to a namespace directory, and back.
// It is the seam for a second layout (an inference server's existing
// directory of raw block files). Paths use '/' and never start with '/' or
// contain "." or ".." components, so openat with the namespace's directory
// fd stays inside it. Implementations are stateless values, safe for
// concurrent use; the Append methods must not allocate beyond growing dst.
type Layout interface {
	// AppendPath appends the block file's path for key to dst.
	AppendPath(dst, key []byte) []byte
	// AppendDir appends the directory holding key's block file to dst
	// ("" if it is the namespace directory itself); AppendPath's path is
	// that directory, '/' and a name.
	AppendDir(dst, key []byte) []byte
	// AppendTempPath appends a temporary path in key's final directory to
	// dst, unique per process and token, recognised by IsTempPath.
	AppendTempPath(dst, key []byte, token uint64) []byte
	// KeyFromPath returns the key whose block file is at rel, or false if
	// rel is not a block file of this layout (a temp file, a stray file).
	KeyFromPath(rel string) ([]byte, bool)
	// IsTempPath reports whether rel is a temporary file of this layout.
	IsTempPath(rel string) bool
}

// FanoutLayout is the default layout: <hex[0:2]>/<hex[2:4]>/<hex>.blk,
// where hex is the key's lowercase hex. Its 256×256 = 65,536 leaf
// directories hold about 150 entries each at 10 million blocks (and 1,500
// at 100 million), small enough that a lookup in ext4's or XFS's hashed
// directories and a readdir during maintenance stay cheap, while the two
// upper levels have exactly 256 entries each. Keys are hashes, so the
// fan-out is uniform.
type FanoutLayout struct{}

var _ Layout = FanoutLayout{}

const (
	blockSuffix = ".blk"
	tempInfix   = ".blk.tmp."
)

// pid and tokenBase make temporary names unique across processes and, with
// O_EXCL, across hosts sharing one export: the pid alone can repeat on
// another host, the random base makes that vanishingly unlikely.
var (
	pid       = os.Getpid()
	tokenBase = randomUint64()
	tokenNext atomic.Uint64
)

func randomUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux 3.17+
	return binary.LittleEndian.Uint64(b[:])
}

// NewTempToken returns a token for Layout.AppendTempPath that no other
// call in this process returns.
func NewTempToken() uint64 { return tokenBase + tokenNext.Add(1) }

// AppendDir appends "<hex[0:2]>/<hex[2:4]>".
func (FanoutLayout) AppendDir(dst, key []byte) []byte {
	dst = appendHex(dst, key[:1])
	dst = append(dst, '/')
	return appendHex(dst, key[1:2])
}

// AppendPath appends "<hex[0:2]>/<hex[2:4]>/<hex>.blk".
func (l FanoutLayout) AppendPath(dst, key []byte) []byte {
	dst = l.AppendDir(dst, key)
	dst = append(dst, '/')
	dst = appendHex(dst, key)
	return append(dst, blockSuffix...)
}

// AppendTempPath appends "<hex[0:2]>/<hex[2:4]>/<hex>.blk.tmp.<pid>.<token hex>".
func (l FanoutLayout) AppendTempPath(dst, key []byte, token uint64) []byte {
	dst = l.AppendDir(dst, key)
	dst = append(dst, '/')
	dst = appendHex(dst, key)
	dst = append(dst, tempInfix...)
	dst = strconv.AppendInt(dst, int64(pid), 10)
	dst = append(dst, '.')
	return strconv.AppendUint(dst, token, 16)
}

// KeyFromPath parses "<hex[0:2]>/<hex[2:4]>/<hex>.blk" and checks that
// the directories match the name, so every key has exactly one path.
func (FanoutLayout) KeyFromPath(rel string) ([]byte, bool) {
	name, ok := fanoutName(rel)
	if !ok || !strings.HasSuffix(name, blockSuffix) {
		return nil, false
	}
	hex := name[:len(name)-len(blockSuffix)]
	if len(hex) < 2*KeySizeMin || len(hex) > 2*KeySizeMax || rel[0:2] != hex[0:2] || rel[3:5] != hex[2:4] {
		return nil, false
	}
	return decodeHex(hex)
}

// IsTempPath reports whether rel looks like "<aa>/<bb>/<name>.blk.tmp.<...>".
func (FanoutLayout) IsTempPath(rel string) bool {
	name, ok := fanoutName(rel)
	return ok && strings.Contains(name, tempInfix)
}

// fanoutName returns the file name of rel if rel is "<2>/<2>/<name>".
func fanoutName(rel string) (string, bool) {
	if len(rel) < 7 || rel[2] != '/' || rel[5] != '/' || strings.IndexByte(rel[6:], '/') >= 0 {
		return "", false
	}
	return rel[6:], true
}
