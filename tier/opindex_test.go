package tier

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpIndex checks the table against a map through random puts and
// removes, with hashes crowded into few home slots so that probe
// sequences run long, wrap around the table's end and cross each other.
func TestOpIndex(t *testing.T) {
	for _, ops := range []int{1, 2, 3, 64} {
		x := newOpIndex(ops)
		require.GreaterOrEqual(t, len(x.slots), 2*ops)
		want := map[uint64]int32{}
		// A hash's top bits pick its home slot: three homes, the last
		// slot among them.
		homes := []uint64{0, 1, uint64(len(x.slots) - 1)}
		rng := rand.New(rand.NewPCG(1, uint64(ops)))
		for step := range 20000 {
			h := homes[rng.IntN(len(homes))]<<x.shift | uint64(rng.IntN(8))
			j, ok := want[h]
			switch {
			case ok && rng.IntN(2) == 0:
				x.remove(h, j+1) // another op's: no change
			case ok:
				x.remove(h, j)
				delete(want, h)
			case len(want) < ops:
				j = int32(rng.IntN(ops))
				x.put(h, j)
				want[h] = j
			}
			for h := range uint64(8) {
				for _, home := range homes {
					k := home<<x.shift | h
					j, ok := x.get(k)
					wj, wok := want[k]
					require.Equal(t, wok, ok, "step %d: hash %x", step, k)
					require.Equal(t, wj, j, "step %d: hash %x", step, k)
				}
			}
		}
	}
}
