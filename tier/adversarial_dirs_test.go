package tier

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
)

// Directories removed under a running tier, as an operator cleaning up
// would: every store must recreate what it needs, and the tier's own
// lookups and loads must see what its stores wrote.

// storeAll stores blocks idx through tr as request req and requires each
// to be Stored.
func storeAll(t *testing.T, tr *Tier, req uint64, idx ...int) {
	t.Helper()
	bufs := make([][]byte, len(idx))
	for j, i := range idx {
		bufs[j] = testPayload(i)
	}
	require.NoError(t, tr.Store(req, testKeys(idx...), bufs))
	r := await(t, tr, req)[req]
	for j, k := range r.Keys {
		require.Equal(t, StatusStored, k.Status, "store of block %d: %v", idx[j], k.Err)
	}
}

// requireVisible requires tr's lookup to find blocks idx and its load to
// return their payloads, as requests req and req+1.
func requireVisible(t *testing.T, tr *Tier, req uint64, idx ...int) {
	t.Helper()
	require.NoError(t, tr.Lookup(req, testKeys(idx...)))
	for j, k := range await(t, tr, req)[req].Keys {
		require.Equal(t, StatusFound, k.Status, "lookup of block %d: %v", idx[j], k.Err)
	}
	bufs := make([][]byte, len(idx))
	for j := range bufs {
		bufs[j] = make([]byte, testBlockSize)
	}
	require.NoError(t, tr.Load(req+1, testKeys(idx...), bufs))
	for j, k := range await(t, tr, req+1)[req+1].Keys {
		require.Equal(t, StatusLoaded, k.Status, "load of block %d: %v", idx[j], k.Err)
		require.Equal(t, testPayload(idx[j]), bufs[j], "payload of block %d", idx[j])
	}
}

// fanoutTop returns the top-level fan-out directory of block i.
func fanoutTop(tr *Tier, i int) string {
	return filepath.Join(tr.nsDir, fmt.Sprintf("%02x", testKey(i)[0]))
}

// sameTopOtherLeaf returns a block whose top-level fan-out directory is
// block i's and whose leaf directory is not.
func sameTopOtherLeaf(t *testing.T, i int) int {
	k := testKey(i)
	for j := i + 1; j < i+100_000; j++ {
		if kj := testKey(j); kj[0] == k[0] && kj[1] != k[1] {
			return j
		}
	}
	require.FailNow(t, "no key shares a top-level fan-out directory with block", "%d", i)
	return 0
}

func TestStoreAfterNamespaceRemoved(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), nil)
		storeAll(t, tr, 1, 0, 1, 2, 3)
		requireVisible(t, tr, 2, 0, 1, 2, 3)
		require.NoError(t, os.RemoveAll(tr.nsDir))

		storeAll(t, tr, 4, 0, 1, 10, 11) // two known directories, two new ones
		requireVisible(t, tr, 5, 0, 1, 10, 11)
		require.NoError(t, tr.Lookup(7, testKeys(2, 3)))
		assert.Equal(t, []Status{StatusMissing, StatusMissing}, statuses(await(t, tr, 7)[7]), "removed with the directory")
	})
}

func TestStoreAfterFanoutRemoved(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		tr := openTier(t, kind, t.TempDir(), nil)
		other := sameTopOtherLeaf(t, 0)
		storeAll(t, tr, 1, 0, 1)
		require.NoError(t, os.RemoveAll(fanoutTop(tr, 0)))

		storeAll(t, tr, 2, other) // a new leaf directory under the removed top
		storeAll(t, tr, 3, 0)     // a leaf directory the tier knew
		requireVisible(t, tr, 4, 0, 1, other)
	})
}

func TestStoreAfterRepeatedRemoval(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		root := t.TempDir()
		tr := openTier(t, kind, root, nil)
		req := uint64(1)
		for round := range 6 {
			// Alternately the namespace, a top-level fan-out directory and
			// the whole root, quarantine directory included.
			victim := []string{tr.nsDir, fanoutTop(tr, 100*round), root}[round%3]
			idx := []int{100 * round, 100*round + 1, sameTopOtherLeaf(t, 100*round)}
			storeAll(t, tr, req, idx[:2]...)
			require.NoError(t, os.RemoveAll(victim), "round %d", round)
			storeAll(t, tr, req+1, idx...)
			requireVisible(t, tr, req+2, idx...)
			req += 4
		}
		assert.DirExists(t, tr.qDir, "the quarantine directory is recreated with the root")
	})
}

// TestNamespaceRecreatedElsewhere removes the namespace directory and lets
// another writer (another process, say) recreate it and store a block: the
// tier's lookups and loads find it within a few seconds without a store
// of their own.
func TestNamespaceRecreatedElsewhere(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		root := t.TempDir()
		tr := openTier(t, kind, root, nil)
		storeAll(t, tr, 1, 0)
		require.NoError(t, os.RemoveAll(tr.nsDir))
		other, err := blockstore.Open(root, blockstore.Options{})
		require.NoError(t, err)
		require.NoError(t, other.Put(tr.Namespace(), testKey(1), testPayload(1)))

		req, deadline := uint64(10), time.Now().Add(5*time.Second)
		for ; ; req++ {
			require.NoError(t, tr.Lookup(req, testKeys(1)))
			if await(t, tr, req)[req].Keys[0].Status == StatusFound {
				break
			}
			require.True(t, time.Now().Before(deadline), "the tier never saw the recreated directory")
			time.Sleep(50 * time.Millisecond)
		}
		requireVisible(t, tr, req+1, 1)
	})
}
