package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
)

// keySize is the size of every key: a SHA-256 digest.
const keySize = sha256.Size

// missingBase is the first index of the keys a workload uses as misses:
// far above any populated range, so they are never present.
const missingBase = 1 << 63

// keyOf returns key i of the data set with seed: SHA-256 of seed and i,
// each a little-endian uint64.
func keyOf(dst []byte, seed, i uint64) []byte {
	var in [16]byte
	binary.LittleEndian.PutUint64(in[:8], seed)
	binary.LittleEndian.PutUint64(in[8:], i)
	sum := sha256.Sum256(in[:])
	return append(dst, sum[:]...)
}

// stampPayload makes buf block i's payload: its first 16 bytes are the seed
// and index, the rest is whatever the buffer held (fillRandom at start), so
// blocks differ without the caller generating every byte.
func stampPayload(buf []byte, seed, i uint64) {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], seed)
	binary.LittleEndian.PutUint64(b[8:], i)
	copy(buf, b[:])
}

// fillRandom fills buf with pseudo-random bytes, so compression or
// deduplication below the filesystem cannot flatter the numbers.
func fillRandom(buf []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x7469657262656e63))
	for len(buf) >= 8 {
		binary.LittleEndian.PutUint64(buf, rng.Uint64())
		buf = buf[8:]
	}
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
}

// manifest records a namespace's data set, so later runs know which keys
// exist: keys 0..Blocks-1 of Seed, each BlockSize bytes. It lives next to
// the namespace directory, as a file the block store ignores.
type manifest struct {
	Seed      uint64 `json:"seed"`
	Blocks    uint64 `json:"blocks"`
	BlockSize int    `json:"block_size"`
}

func manifestPath(dir, ns string) string {
	return filepath.Join(dir, "tierbench-"+ns+".json")
}

// errNoManifest means nothing was populated in the namespace.
var errNoManifest = errors.New("no tierbench data set")

func readManifest(dir, ns string) (manifest, error) {
	var m manifest
	b, err := os.ReadFile(manifestPath(dir, ns))
	if errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("%w in %s namespace %s: run tierbench populate --dir %s first", errNoManifest, dir, ns, dir)
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%s: %w", manifestPath(dir, ns), err)
	}
	if m.BlockSize <= 0 {
		return m, fmt.Errorf("%s: block size %d", manifestPath(dir, ns), m.BlockSize)
	}
	return m, nil
}

// writeManifest replaces the manifest atomically.
func writeManifest(dir, ns string, m manifest) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	path := manifestPath(dir, ns)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// distribution says how a workload picks keys from the data set
// (--dist): uniform (every key in turn, in a random order), zipf (rank r
// with probability ∝ 1/r^s) or hot (a share of the picks from a small set).
type distribution struct {
	name     string  // uniform, zipf or hot
	zipfS    float64 // zipf's exponent s > 1
	hotKeys  float64 // hot: the fraction of the keys that are hot
	hotShare float64 // hot: the fraction of picks that go to them
}

func (d distribution) String() string {
	switch d.name {
	case "zipf":
		return fmt.Sprintf("zipf s=%g", d.zipfS)
	case "hot":
		return fmt.Sprintf("hot %g%% of picks to %g%% of keys", 100*d.hotShare, 100*d.hotKeys)
	}
	return d.name
}

// picker picks indexes from 0..n-1 by a distribution.
type picker struct {
	d    distribution
	n    int
	rng  *rand.Rand
	zipf *rand.Zipf
	next int // uniform: the next index
	hotN int // hot: indexes below hotN are hot
}

func newPicker(d distribution, n int, rng *rand.Rand) *picker {
	p := &picker{d: d, n: n, rng: rng}
	switch d.name {
	case "zipf":
		p.zipf = rand.NewZipf(rng, d.zipfS, 1, uint64(max(n-1, 0)))
	case "hot":
		p.hotN = min(max(int(d.hotKeys*float64(n)), 1), n)
	}
	return p
}

func (p *picker) pick() int {
	switch p.d.name {
	case "zipf":
		return int(p.zipf.Uint64())
	case "hot":
		if p.hotN == p.n || p.rng.Float64() < p.d.hotShare {
			return p.rng.IntN(p.hotN)
		}
		return p.hotN + p.rng.IntN(p.n-p.hotN)
	}
	i := p.next
	p.next = (p.next + 1) % p.n
	return i
}

// keySet is the keys a lookup or load workload draws from: present keys
// from the populated range, missing keys from far outside it.
type keySet struct {
	present [][]byte // a sample (all, up to presentMax) of the populated range, in random order
	missing []byte   // the missing keys, keySize bytes each, when hit < 1
	rng     *rand.Rand
	hit     float64
	dist    distribution
	keys    *picker // over present
	chains  *picker // over chains of present keys, for prefix lookups
	m       int     // next missing key
}

const presentMax = 1 << 20

// newKeySet precomputes the keys, present and (with hit < 1) misses
// missing ones from index missFrom on, drawn in turn, in one allocation
// each, so that neither hashing nor garbage falls in the measured stretch
// (hashed on first use, the missing keys were 65,536 allocations early in
// every lookup and load run).
// With the uniform distribution keys are drawn in order; with more keys
// than one window of depth × batch, no key is in flight twice (which would
// let lookups share operations). The skewed distributions pick by rank in
// the same random order, so hot keys are spread over the directories.
func newKeySet(m manifest, hit float64, dist distribution, missFrom uint64, misses int) *keySet {
	rng := rand.New(rand.NewPCG(m.Seed, 0x6b657973))
	ks := &keySet{rng: rng, hit: hit, dist: dist}
	n := min(m.Blocks, presentMax)
	var idx []uint64
	if n == m.Blocks {
		idx = make([]uint64, n)
		for i := range idx {
			idx[i] = uint64(i)
		}
		rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	} else {
		for range n {
			idx = append(idx, rng.Uint64N(m.Blocks))
		}
	}
	mem := make([]byte, 0, len(idx)*keySize)
	for _, i := range idx {
		mem = keyOf(mem, m.Seed, i)
		ks.present = append(ks.present, mem[len(mem)-keySize:])
	}
	if len(ks.present) > 0 {
		ks.keys = newPicker(dist, len(ks.present), rng)
	}
	if hit < 1 || len(ks.present) == 0 {
		ks.missing = make([]byte, 0, misses*keySize)
		for i := range uint64(misses) {
			ks.missing = keyOf(ks.missing, m.Seed, missFrom+i)
		}
	}
	return ks
}

// next returns the next key: present with probability hit.
func (ks *keySet) next() []byte {
	if len(ks.present) > 0 && (ks.hit >= 1 || ks.rng.Float64() < ks.hit) {
		return ks.present[ks.keys.pick()]
	}
	return ks.nextMissing()
}

func (ks *keySet) nextMissing() []byte {
	k := ks.missing[ks.m*keySize : (ks.m+1)*keySize : (ks.m+1)*keySize]
	ks.m = (ks.m + 1) % (len(ks.missing) / keySize)
	return k
}

// chain fills keys with one chain, as an inference scheduler asks for a
// prompt's blocks: the present keys are cut into chains of len(keys), one
// is picked by the distribution, and its first k keys are asked for, the
// rest being keys the data set lacks: k = len(keys) (the whole chain is
// there) with probability hit, else k is uniform in 0..len(keys)-1.
func (ks *keySet) chain(keys [][]byte) {
	l := len(keys)
	k := l
	switch {
	case len(ks.present) == 0:
		k = 0
	case ks.hit < 1 && ks.rng.Float64() >= ks.hit:
		k = ks.rng.IntN(l)
	}
	if ks.chains == nil || ks.chains.n != max(len(ks.present)/l, 1) {
		ks.chains = newPicker(ks.dist, max(len(ks.present)/l, 1), ks.rng)
	}
	start := ks.chains.pick() * l
	for j := range keys {
		if j < k {
			keys[j] = ks.present[(start+j)%len(ks.present)]
		} else {
			keys[j] = ks.nextMissing()
		}
	}
}
