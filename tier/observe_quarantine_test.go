package tier

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/blockstore"
)

// TestQuarantineLogged loads a block whose payload was damaged: the engine
// moves it into the quarantine directory and calls noteQuarantine, so the
// log has a line with both paths and Stats counts the move.
func TestQuarantineLogged(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind EngineKind) {
		rec := &logRecorder{}
		tr := openTier(t, kind, t.TempDir(), func(o *Options) { o.Logger = slog.New(rec) })
		put(t, tr, 0)
		path := blockFile(tr, 0)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte{0xff, 0xfe}, blockstore.HeaderSize+100)
		require.NoError(t, err)
		require.NoError(t, f.Close())

		require.NoError(t, tr.Load(1, testKeys(0), [][]byte{make([]byte, testBlockSize)}))
		require.Equal(t, StatusCorrupt, await(t, tr, 1)[1].Keys[0].Status)
		assert.NoFileExists(t, path, "the corrupt block was not moved")
		moved, err := filepath.Glob(filepath.Join(tr.qDir, "default.*"))
		require.NoError(t, err)
		require.Len(t, moved, 1)

		st := tr.Stats()
		assert.Equal(t, uint64(1), st.Quarantined)
		level, attrs, ok := rec.find("quarantine")
		require.True(t, ok, "no quarantine line: %q", rec.messages())
		assert.Equal(t, slog.LevelWarn, level)
		assert.Equal(t, path, attrs["path"])
		assert.Equal(t, moved[0], attrs["quarantine"])
		assert.Contains(t, attrs["cause"], "checksum")
	})
}
