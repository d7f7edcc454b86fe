package tier

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/uringtier/uringtier/blockstore"
)

// Recency that every process sharing the directory can see, whatever the
// mount's atime policy: a tier that finds, loads or re-offers a block sets
// the block file's access time to now (utimensat; explicit times are
// recorded on noatime mounts too), at most once per block per
// TouchInterval and ring (loads of a block may run on any ring). An
// evictor orders blocks by max(atime, mtime) and, before it removes one,
// reads its times again: a block another process used since the
// evictor's scan is kept. So a block written by host A and read only by
// host B is ordered by the later of A's write and B's last touch, which is
// at most TouchInterval older than B's last read.
//
// Owners decide what to touch (a map per shard, no lock); one goroutine
// issues the system calls, so that a hung filesystem blocks it alone. When
// it falls behind, touches are dropped and counted: recency is a hint.

// touch is a block to mark used.
type touch struct {
	key [blockstore.KeySizeMax]byte
	n   uint8
}

// touchQueue bounds the touches waiting for the toucher.
const touchQueue = 4096

// touchedMax bounds each shard's memory of recent touches; a full map is
// emptied, which costs extra touches, not correctness.
const touchedMax = 1 << 18

// noteUse marks op o's block used now, unless this tier did so within
// TouchInterval. Owner-only.
func (s *shard) noteUse(o *op, now time.Time) {
	iv := s.t.opts.TouchInterval
	if iv <= 0 {
		return
	}
	at := now.UnixNano()
	if last, ok := s.touched[o.hash]; ok && at-last < int64(iv) {
		return
	}
	if len(s.touched) >= touchedMax {
		clear(s.touched)
	}
	s.touched[o.hash] = at
	select {
	case s.t.touchC <- touch{key: o.key, n: o.keyLen}:
	default:
		s.t.cap.touchDropped.Add(1)
	}
}

// toucher sets the access time of the blocks owners send, until stop.
func (t *Tier) toucher(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	layout := t.store.Layout()
	path := make([]byte, 0, len(t.nsDir)+blockstore.PathMax+2)
	times := [2]unix.Timespec{1: {Nsec: unix.UTIME_OMIT}} // atime now, mtime as it is
	cwd := unix.AT_FDCWD
	for {
		var tc touch
		select {
		case <-stop:
			return
		case tc = <-t.touchC:
		}
		path = append(append(path[:0], t.nsDir...), '/')
		path = append(layout.AppendPath(path, tc.key[:tc.n]), 0)
		times[0] = unix.NsecToTimespec(time.Now().UnixNano())
		// utimensat(2) directly: UtimesNanoAt would allocate a string and a
		// slice per block.
		_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(cwd), uintptr(unsafe.Pointer(&path[0])),
			uintptr(unsafe.Pointer(&times)), unix.AT_SYMLINK_NOFOLLOW, 0, 0)
		if e == 0 {
			t.cap.touches.Add(1)
		}
	}
}
