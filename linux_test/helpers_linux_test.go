package linux_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
)

// blockSize is the tests' block payload: small, so that many keys are cheap.
const blockSize = 4096

// engines runs f against both engines, as subtests named by the engine.
func engines(t *testing.T, f func(t *testing.T, kind tier.EngineKind)) {
	for _, kind := range []tier.EngineKind{tier.EngineURing, tier.EngineSync} {
		t.Run(kind.String(), func(t *testing.T) { f(t, kind) })
	}
}

// mountFaultFS mounts a faultfs pass-through over a fresh directory, or skips t saying why FUSE is
// unusable here. The mount is gone when t ends (cleanups run last-in first-out, so a tier opened
// on it afterwards is closed first).
func mountFaultFS(t *testing.T) *faultfs.FS { return mountFaultFSWith(t, faultfs.Options{}) }

// mountFaultFSWith is mountFaultFS with opts.
func mountFaultFSWith(t *testing.T, opts faultfs.Options) *faultfs.FS {
	t.Helper()
	if err := faultfs.Available(); err != nil {
		t.Skipf("needs FUSE: %v", err)
	}
	fsys, err := faultfs.Mount(t.TempDir(), t.TempDir(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, fsys.Unmount()) })
	return fsys
}

// needRoot skips t when it cannot mount.
func needRoot(t *testing.T, what string) {
	t.Helper()
	if euid := os.Geteuid(); euid != 0 {
		t.Skipf("%s needs root (euid is %d)", what, euid)
	}
}

// openTier opens a tier of kind on dir with the tests' defaults changed by mod, and closes it when
// t ends.
func openTier(t testing.TB, kind tier.EngineKind, dir string, mod func(*tier.Options)) *tier.Tier {
	t.Helper()
	// No lookup cache: these tests are about what the filesystem answers.
	opts := tier.Options{BlockSize: blockSize, Engine: kind, Rings: 2, OpsMax: 64, LookupCacheTTL: -1}
	if mod != nil {
		mod(&opts)
	}
	tr, err := tier.Open(dir, opts)
	require.NoError(t, err)
	require.Equal(t, kind, tr.Engine().Kind)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tr.Close(ctx)
	})
	return tr
}

// key returns the i-th test key: a hash, as real keys are.
func key(i int) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	h := sha256.Sum256(b[:])
	return h[:]
}

func keys(idx ...int) [][]byte {
	ks := make([][]byte, len(idx))
	for j, i := range idx {
		ks[j] = key(i)
	}
	return ks
}

// keyRange returns the keys of from..to-1.
func keyRange(from, to int) [][]byte {
	ks := make([][]byte, 0, to-from)
	for i := from; i < to; i++ {
		ks = append(ks, key(i))
	}
	return ks
}

// payload returns block i's content, size bytes.
func payload(i, size int) []byte {
	p := make([]byte, size)
	rng := rand.New(rand.NewPCG(uint64(i), 11))
	for k := 0; k < size; k += 8 {
		binary.LittleEndian.PutUint64(p[k:], rng.Uint64())
	}
	return p
}

func buffers(n, size int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs
}

// await polls tr until every request in want has reported, and returns the Results by request ID
// (OpRelease events are not collected). A second Result for a request fails t.
func await(t testing.TB, tr *tier.Tier, want ...uint64) map[uint64]tier.Result {
	t.Helper()
	got := map[uint64]tier.Result{}
	buf := make([]tier.Result, 16)
	deadline := time.After(30 * time.Second)
	for len(got) < len(want) {
		select {
		case <-tr.Ready():
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			require.FailNow(t, "timed out waiting for results", "have %d of %d", len(got), len(want))
		}
		for n := tr.Poll(buf); n > 0; n = tr.Poll(buf) {
			for _, r := range buf[:n] {
				if r.Op == tier.OpRelease {
					continue
				}
				_, dup := got[r.Req]
				require.False(t, dup, "two results for request %d", r.Req)
				r.Keys = append([]tier.KeyResult(nil), r.Keys...)
				got[r.Req] = r
			}
		}
	}
	return got
}

func statuses(r tier.Result) []tier.Status {
	s := make([]tier.Status, len(r.Keys))
	for i, k := range r.Keys {
		s[i] = k.Status
	}
	return s
}

// tempFiles returns the temporary (unpublished) block files under the store's namespace ns.
func tempFiles(t testing.TB, store *blockstore.Store, ns string) []string {
	t.Helper()
	dir, err := store.NamespaceDir(ns)
	require.NoError(t, err)
	var tmp []string
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if store.Layout().IsTempPath(rel) || strings.Contains(d.Name(), ".tmp.") {
			tmp = append(tmp, rel)
		}
		return nil
	})
	require.NoError(t, err)
	return tmp
}

// verifyClean asserts that every visible block in ns is whole and valid.
func verifyClean(t testing.TB, store *blockstore.Store, ns string, msg string) blockstore.VerifyStats {
	t.Helper()
	var problems []string
	st, err := store.Verify(ns, blockstore.VerifyReport, func(p blockstore.Problem) {
		problems = append(problems, p.Block.Path+": "+p.Err.Error())
	})
	require.NoError(t, err, msg)
	require.Empty(t, problems, "%s: corrupt visible blocks", msg)
	return st
}
