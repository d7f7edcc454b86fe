package blockstore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keySharingTop returns a key whose top-level fan-out directory is key's
// and whose leaf directory is not.
func keySharingTop(t *testing.T, key []byte) []byte {
	for i := 1; i < 100_000; i++ {
		if k := testKey(i, len(key)); k[0] == key[0] && k[1] != key[1] {
			return k
		}
	}
	require.FailNow(t, "no key shares the top-level fan-out directory", "%x", key[:1])
	return nil
}

// TestPutAfterDirectoriesRemoved removes directories the Store remembers,
// up to its root, and stores into a directory it has never seen under the
// removed one: Put recreates every missing level.
func TestPutAfterDirectoriesRemoved(t *testing.T) {
	key := testKey(0, 32)
	other := keySharingTop(t, key)
	for _, c := range []struct {
		name   string
		victim func(s *Store) string
	}{
		{"fanout", func(s *Store) string { return filepath.Join(s.Root(), "ns", fmt.Sprintf("%02x", key[0])) }},
		{"namespace", func(s *Store) string { return filepath.Join(s.Root(), "ns") }},
		{"root", func(s *Store) string { return s.Root() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openTestStore(t, Options{Durability: DurabilityFull})
			require.NoError(t, s.Put("ns", key, []byte("one")))
			require.NoError(t, os.RemoveAll(c.victim(s)))

			require.NoError(t, s.Put("ns", other, []byte("two")))
			require.NoError(t, s.Put("ns", key, []byte("three")))
			for k, want := range map[string]string{string(other): "two", string(key): "three"} {
				buf := make([]byte, len(want))
				_, err := s.Get("ns", []byte(k), buf)
				require.NoError(t, err)
				assert.Equal(t, want, string(buf))
			}
		})
	}
}
