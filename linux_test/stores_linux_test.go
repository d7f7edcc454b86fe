package linux_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/internal/faultfs"
	"github.com/uringtier/uringtier/tier"
)

// TestReadsBeforeStores: on a slow filesystem (2 ms an operation), a burst
// of 128 stores submitted first must not hold up a lookup submitted after
// it: the lookup's keys start at once, ahead of the stores queued for op
// slots, and it reports while most stores are still to come. Every store
// still completes.
func TestReadsBeforeStores(t *testing.T) {
	fsys := mountFaultFS(t)
	seed := openTier(t, tier.EngineSync, fsys.Backing(), nil)
	for i := 1000; i < 1064; i += 2 {
		require.NoError(t, seed.BlockStore().Put(seed.Namespace(), key(i), payload(i, blockSize)))
	}
	rule, err := fsys.Inject(faultfs.Fault{Ops: faultfs.OpAll, Latency: 2 * time.Millisecond})
	require.NoError(t, err)

	engines(t, func(t *testing.T, kind tier.EngineKind) {
		tr := openTier(t, kind, fsys.Mountpoint(), nil) // OpsMax 64: the stores alone could fill it
		const stores = 128
		bufs := make([][]byte, stores)
		for i := range bufs {
			bufs[i] = payload(i, blockSize)
		}
		base := map[tier.EngineKind]int{tier.EngineURing: 0, tier.EngineSync: 10_000}[kind]
		require.NoError(t, tr.Store(1, keyRange(base, base+stores), bufs))
		require.NoError(t, tr.Lookup(2, keyRange(1000, 1064)))

		got := await(t, tr, 2)
		for j, s := range statuses(got[2]) {
			want := map[bool]tier.Status{true: tier.StatusFound, false: tier.StatusMissing}[j%2 == 0]
			require.Equal(t, want, s, "key %d", 1000+j)
		}
		st := tr.Stats()
		stored := st.Outcomes[tier.OpStore][tier.StatusStored]
		t.Logf("%s: the lookup reported with %d of %d stores done", kind, stored, stores)
		assert.Less(t, stored, uint64(stores/2), "the lookup waited behind the stores")

		got = await(t, tr, 1)
		assert.Equal(t, statusesOf(stores, tier.StatusStored), statuses(got[1]))
	})
	assert.Positive(t, rule.Fired())
}

func statusesOf(n int, s tier.Status) []tier.Status {
	out := make([]tier.Status, n)
	for i := range out {
		out[i] = s
	}
	return out
}
