package uring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// newRing creates a ring owned by the calling goroutine's locked thread.
func newRing(t testing.TB, entries uint32, opts Options) *Ring {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	r, err := New(entries, opts)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r
}

// cstr returns a NUL-terminated copy of s on the heap.
func cstr(s string) *byte {
	b, err := unix.BytePtrFromString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func getSQE(t testing.TB, r *Ring) *SQE {
	t.Helper()
	sqe := r.GetSQE()
	require.NotNil(t, sqe, "SQ full")
	return sqe
}

// run submits what is prepared and waits for n CQEs, returned by user_data.
func run(t testing.TB, r *Ring, n int) map[uint64]CQE {
	t.Helper()
	got := map[uint64]CQE{}
	cqes := make([]CQE, 64)
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n {
		require.True(t, time.Now().Before(deadline), "only %d of %d completions", len(got), n)
		_, err := r.SubmitAndWait(1, time.Second)
		require.NoError(t, err)
		k := r.Reap(cqes)
		for _, c := range cqes[:k] {
			_, dup := got[c.UserData]
			require.False(t, dup, "two CQEs for user_data %d", c.UserData)
			got[c.UserData] = c
		}
	}
	return got
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, data, 0o644))
}

func TestNewReportsFlags(t *testing.T) {
	r := newRing(t, 8, Options{})
	assert.NotZero(t, r.Features()&FeatSingleMmap)
	assert.NotZero(t, r.Features()&FeatExtArg)
	// Linux 6.18: every flag we ask for is known.
	want := FlagSubmitAll | FlagCoopTaskrun | FlagTaskrunFlag | FlagSingleIssuer | FlagDeferTaskrun | FlagNoSQArray
	assert.Equal(t, want, r.Flags(), "got %v", r.Flags())
	assert.Equal(t, uint32(8), r.SQEntries())
	assert.Equal(t, uint32(16), r.CQEntries())

	r2 := newRing(t, 8, Options{CQEntries: 64, Disable: FlagNoSQArray | FlagDeferTaskrun})
	assert.Zero(t, r2.Flags()&(FlagNoSQArray|FlagDeferTaskrun), "disabled flags in force: %v", r2.Flags())
	assert.NotZero(t, r2.Flags()&FlagCQSize)
	assert.Equal(t, uint32(64), r2.CQEntries())
}

func TestAvailable(t *testing.T) {
	require.NoError(t, Available())
	r := newRing(t, 4, Options{})
	p, err := r.Probe()
	require.NoError(t, err)
	for _, op := range RequiredOps {
		assert.True(t, p.Supports(op), "%v", op)
	}
}

func TestSetupErrorSaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	old := disabledSysctl
	t.Cleanup(func() { disabledSysctl = old })
	disabledSysctl = filepath.Join(dir, "io_uring_disabled")

	cases := []struct {
		errno  syscall.Errno
		sysctl string
		want   string
	}{
		{syscall.ENOSYS, "", "kernel is older"},
		{syscall.EPERM, "2", "kernel.io_uring_disabled=2"},
		{syscall.EPERM, "1", "kernel.io_uring_group"},
		{syscall.EPERM, "0", "seccomp"},
		{syscall.ENOMEM, "", "RLIMIT_MEMLOCK"},
	}
	for _, c := range cases {
		writeFile(t, disabledSysctl, []byte(c.sysctl+"\n"))
		err := setupError(c.errno)
		var ue *UnavailableError
		require.ErrorAs(t, err, &ue)
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.ErrorIs(t, err, c.errno)
		assert.Contains(t, err.Error(), c.want)
	}
	e := &UnavailableError{Missing: []Opcode{OpMkdirat, OpRenameat}, Reason: "old"}
	assert.Contains(t, e.Error(), "MKDIRAT, RENAMEAT")
}

func TestNop(t *testing.T) {
	r := newRing(t, 8, Options{})
	for i := range 5 {
		getSQE(t, r).PrepareNop()
		r.sqes[(r.sqeTail-1)&r.sqMask].UserData = uint64(i)
	}
	got := run(t, r, 5)
	for i := range 5 {
		assert.Equal(t, int32(0), got[uint64(i)].Res)
	}
}

func TestStatx(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "present"), make([]byte, 1234))
	r := newRing(t, 8, Options{})
	var st1, st2 unix.Statx_t
	s := getSQE(t, r)
	s.PrepareStatx(unix.AT_FDCWD, cstr(filepath.Join(dir, "present")), 0, unix.STATX_SIZE, &st1)
	s.UserData = 1
	s = getSQE(t, r)
	s.PrepareStatx(unix.AT_FDCWD, cstr(filepath.Join(dir, "missing")), 0, unix.STATX_SIZE, &st2)
	s.UserData = 2
	got := run(t, r, 2)
	require.NoError(t, ptr(got[1]).Err())
	assert.Equal(t, uint64(1234), st1.Size)
	assert.ErrorIs(t, ptr(got[2]).Err(), syscall.ENOENT)
}

func ptr(c CQE) *CQE { return &c }

func TestOpenReadWriteCloseFsync(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	r := newRing(t, 8, Options{})

	s := getSQE(t, r)
	s.PrepareOpenat(unix.AT_FDCWD, cstr(path), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	s.UserData = 1
	c := run(t, r, 1)[1]
	require.NoError(t, c.Err())
	fd := int(c.Res)

	data := []byte("hello, ring")
	s = getSQE(t, r)
	s.PrepareWrite(fd, data, 0)
	s.UserData = 2
	s.Flags |= SQEIOLink
	s = getSQE(t, r)
	s.PrepareFsync(fd, true)
	s.UserData = 3
	got := run(t, r, 2)
	assert.Equal(t, int32(len(data)), got[2].Res)
	assert.Equal(t, int32(0), got[3].Res)

	// A read past what the file holds is short, not an error.
	buf := make([]byte, 100)
	s = getSQE(t, r)
	s.PrepareRead(fd, buf, 0)
	s.UserData = 4
	s = getSQE(t, r)
	s.PrepareRead(fd, buf[50:], 1000)
	s.UserData = 5
	got = run(t, r, 2)
	assert.Equal(t, int32(len(data)), got[4].Res)
	assert.Equal(t, data, buf[:len(data)])
	assert.Equal(t, int32(0), got[5].Res)

	// A vectored read fills its buffers in turn; the last one past the
	// file's end stays as it was.
	v0, v1, v2 := make([]byte, 5), make([]byte, 4), []byte{9, 9}
	iov := []unix.Iovec{{Base: &v0[0], Len: 5}, {Base: &v1[0], Len: 4}, {Base: &v2[0], Len: 2}}
	s = getSQE(t, r)
	s.PrepareReadv(fd, iov, 2)
	s.UserData = 7
	got = run(t, r, 1)
	assert.Equal(t, int32(len(data)-2), got[7].Res)
	assert.Equal(t, "llo, ring", string(v0)+string(v1))
	assert.Equal(t, []byte{9, 9}, v2)

	// A vectored write writes its buffers in turn.
	w0, w1 := []byte("HEL"), []byte("LO")
	s = getSQE(t, r)
	s.PrepareWritev(fd, []unix.Iovec{{Base: &w0[0], Len: 3}, {Base: &w1[0], Len: 2}}, 0)
	s.UserData = 8
	assert.Equal(t, int32(5), run(t, r, 1)[8].Res)
	got2, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "HELLO, ring", string(got2))

	s = getSQE(t, r)
	s.PrepareClose(fd)
	s.UserData = 6
	require.NoError(t, ptr(run(t, r, 1)[6]).Err())

	// The fd is closed now: every use of it fails with EBADF.
	s = getSQE(t, r)
	s.PrepareRead(fd, buf, 0)
	s.UserData = 7
	s = getSQE(t, r)
	s.PrepareWrite(fd, data, 0)
	s.UserData = 8
	s = getSQE(t, r)
	s.PrepareClose(fd)
	s.UserData = 9
	s = getSQE(t, r)
	s.PrepareFsync(fd, false)
	s.UserData = 10
	got = run(t, r, 4)
	for ud := uint64(7); ud <= 10; ud++ {
		assert.ErrorIs(t, ptr(got[ud]).Err(), syscall.EBADF, "user_data %d", ud)
	}

	s = getSQE(t, r)
	s.PrepareOpenat(unix.AT_FDCWD, cstr(filepath.Join(dir, "nope")), unix.O_RDONLY, 0)
	s.UserData = 11
	assert.ErrorIs(t, ptr(run(t, r, 1)[11]).Err(), syscall.ENOENT)
}

func TestRenameUnlinkMkdir(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a"), []byte("x"))
	r := newRing(t, 8, Options{})
	dfd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(dfd)

	s := getSQE(t, r)
	s.PrepareMkdirat(dfd, cstr("sub"), 0o755)
	s.UserData = 1
	s.Flags |= SQEIOLink
	s = getSQE(t, r)
	s.PrepareRenameat(dfd, cstr("a"), dfd, cstr("sub/b"), 0)
	s.UserData = 2
	got := run(t, r, 2)
	require.NoError(t, ptr(got[1]).Err())
	require.NoError(t, ptr(got[2]).Err())
	b, err := os.ReadFile(filepath.Join(dir, "sub", "b"))
	require.NoError(t, err)
	assert.Equal(t, "x", string(b))

	s = getSQE(t, r)
	s.PrepareMkdirat(dfd, cstr("sub"), 0o755)
	s.UserData = 3
	s = getSQE(t, r)
	s.PrepareRenameat(dfd, cstr("a"), dfd, cstr("c"), 0)
	s.UserData = 4
	s = getSQE(t, r)
	s.PrepareUnlinkat(dfd, cstr("sub/b"), 0)
	s.UserData = 5
	s = getSQE(t, r)
	s.PrepareUnlinkat(dfd, cstr("sub/b"), 0)
	s.UserData = 6
	got = run(t, r, 4)
	assert.ErrorIs(t, ptr(got[3]).Err(), syscall.EEXIST)
	assert.ErrorIs(t, ptr(got[4]).Err(), syscall.ENOENT)
	// 5 and 6 race in the kernel unless linked; exactly one of them wins.
	errs := []error{ptr(got[5]).Err(), ptr(got[6]).Err()}
	assert.ElementsMatch(t, []error{nil, syscall.ENOENT}, errs)

	s = getSQE(t, r)
	s.PrepareUnlinkat(dfd, cstr("sub"), unix.AT_REMOVEDIR)
	s.UserData = 7
	require.NoError(t, ptr(run(t, r, 1)[7]).Err())
	assert.NoDirExists(t, filepath.Join(dir, "sub"))
}

func TestFixedBuffersODirect(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	r := newRing(t, 8, Options{})
	buf, err := AllocBuffer(8192)
	require.NoError(t, err)
	defer FreeBuffer(buf)
	require.NoError(t, r.RegisterBuffers([][]byte{buf}))

	for i := range buf {
		buf[i] = byte(i * 7)
	}
	want := append([]byte(nil), buf...)
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC|unix.O_DIRECT, 0o644)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("O_DIRECT unsupported on %s", dir)
	}
	require.NoError(t, err)
	defer unix.Close(fd)

	s := getSQE(t, r)
	s.PrepareWriteFixed(fd, buf, 0, 0)
	s.UserData = 1
	require.Equal(t, int32(8192), run(t, r, 1)[1].Res)
	clear(buf)
	s = getSQE(t, r)
	s.PrepareReadFixed(fd, buf[4096:], 4096, 0)
	s.UserData = 2
	require.Equal(t, int32(4096), run(t, r, 1)[2].Res)
	assert.Equal(t, want[4096:], buf[4096:])

	// A buffer index that was never registered is refused.
	s = getSQE(t, r)
	s.PrepareReadFixed(fd, buf, 0, 3)
	s.UserData = 3
	assert.ErrorIs(t, ptr(run(t, r, 1)[3]).Err(), syscall.EFAULT)
	require.NoError(t, r.UnregisterBuffers())
}

// TestLinkedOpenReadCloseFixedSlot runs a whole load as one chain: the
// kernel opens into a fixed slot, reads through it and closes it without
// coming back to us between the steps.
func TestLinkedOpenReadCloseFixedSlot(t *testing.T) {
	dir := t.TempDir()
	data := []byte("linked chain contents")
	writeFile(t, filepath.Join(dir, "f"), data)
	r := newRing(t, 8, Options{})
	require.NotZero(t, r.Features()&FeatLinkedFile)
	require.NoError(t, r.RegisterFilesSparse(4))

	buf := make([]byte, 64)
	chain := func(path string) map[uint64]CQE {
		s := getSQE(t, r)
		s.PrepareOpenatDirect(unix.AT_FDCWD, cstr(path), unix.O_RDONLY, 0, 2)
		s.Flags |= SQEIOLink
		s.UserData = 1
		s = getSQE(t, r)
		s.PrepareRead(2, buf, 0)
		// A short read breaks an IO_LINK chain; IO_HARDLINK makes sure
		// the slot is closed whatever the read returned.
		s.Flags |= SQEIOHardlink | SQEFixedFile
		s.UserData = 2
		s = getSQE(t, r)
		s.PrepareCloseDirect(2)
		s.UserData = 3
		n, err := r.SubmitAndWait(3, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		// All three completions are there after one enter: no round trip.
		cqes := make([]CQE, 8)
		k := r.Reap(cqes)
		require.Equal(t, 3, k)
		got := map[uint64]CQE{}
		for _, c := range cqes[:k] {
			got[c.UserData] = c
		}
		return got
	}
	got := chain(filepath.Join(dir, "f"))
	assert.Equal(t, int32(0), got[1].Res)
	assert.Equal(t, int32(len(data)), got[2].Res)
	assert.Equal(t, data, buf[:len(data)])
	assert.Equal(t, int32(0), got[3].Res)

	// A failing open breaks the chain: the rest is canceled.
	got = chain(filepath.Join(dir, "missing"))
	assert.ErrorIs(t, ptr(got[1]).Err(), syscall.ENOENT)
	assert.ErrorIs(t, ptr(got[2]).Err(), syscall.ECANCELED)
	assert.ErrorIs(t, ptr(got[3]).Err(), syscall.ECANCELED)

	// The slot was closed by the first chain: closing it again is EBADF.
	s := getSQE(t, r)
	s.PrepareCloseDirect(2)
	s.UserData = 9
	assert.ErrorIs(t, ptr(run(t, r, 1)[9]).Err(), syscall.EBADF)
	require.NoError(t, r.UnregisterFiles())
}

// TestCQESkipLinks checks the rules of IOSQE_CQE_SKIP_SUCCESS in linked
// chains that the tier's io_uring engine relies on (tier.postedCQEs models
// them): a step posts unless it succeeded with the flag; an IO_LINK step
// that fails (a short read too) cancels the rest of its chain, whose steps
// post -ECANCELED whatever their flags, unless the failed step had the
// flag: then none of them posts; a failed IO_HARDLINK step cancels nothing.
// Inline and in a kernel worker alike.
func TestCQESkipLinks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "short")
	writeFile(t, path, []byte("abc"))
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	buf := make([]byte, 8)

	const (
		ok    = iota // a NOP
		fail         // a CLOSE of -1: EBADF
		short        // a READ of 8 bytes of a 3-byte file
	)
	type step struct {
		kind  int
		flags uint8
	}
	L, H, S := SQEIOLink, SQEIOHardlink, SQECQESkipSuccess
	ebadf, ecanceled := -int32(syscall.EBADF), -int32(syscall.ECANCELED)
	for _, c := range []struct {
		name  string
		steps []step
		want  map[uint64]int32 // the completions posted: step, result
	}{
		{"success posts the last step only", []step{{ok, L | S}, {ok, L | S}, {ok, 0}}, map[uint64]int32{2: 0}},
		{"a skipping step that fails posts alone", []step{{ok, L | S}, {fail, L | S}, {ok, H}, {ok, 0}}, map[uint64]int32{1: ebadf}},
		{"a posting step that fails: the rest post ECANCELED", []step{{ok, L | S}, {fail, L}, {ok, L | S}, {ok, 0}},
			map[uint64]int32{1: ebadf, 2: ecanceled, 3: ecanceled}},
		{"a hard link goes on", []step{{fail, H}, {ok, L | S}, {ok, 0}}, map[uint64]int32{0: ebadf, 2: 0}},
		{"a short read fails", []step{{ok, L | S}, {short, L | S}, {ok, 0}}, map[uint64]int32{1: 3}},
	} {
		for _, async := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/async=%v", c.name, async), func(t *testing.T) {
				r := newRing(t, 8, Options{})
				for k, st := range c.steps {
					s := getSQE(t, r)
					switch st.kind {
					case ok:
						s.PrepareNop()
					case fail:
						s.PrepareClose(-1)
					case short:
						s.PrepareRead(fd, buf, 0)
					}
					s.Flags |= st.flags
					if async {
						s.Flags |= SQEAsync
					}
					s.UserData = uint64(k)
				}
				got := run(t, r, len(c.want))
				res := map[uint64]int32{}
				for k, cqe := range got {
					res[k] = cqe.Res
				}
				assert.Equal(t, c.want, res)
				_, err := r.SubmitAndWait(1, 50*time.Millisecond)
				require.NoError(t, err)
				assert.Zero(t, r.Reap(make([]CQE, 8)), "a completion the rules do not post")
			})
		}
	}
}

func pipe(t testing.TB) (rd, wr int) {
	t.Helper()
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

func TestLinkTimeout(t *testing.T) {
	r := newRing(t, 8, Options{})
	rd, wr := pipe(t)
	buf := make([]byte, 8)
	ts := &Timespec{Nsec: int64(20 * time.Millisecond)}

	// Fires: a read of an empty pipe would wait forever.
	s := getSQE(t, r)
	s.PrepareRead(rd, buf, 0)
	s.Flags |= SQEIOLink
	s.UserData = 1
	getSQE(t, r).PrepareLinkTimeout(ts)
	r.sqes[(r.sqeTail-1)&r.sqMask].UserData = 2
	got := run(t, r, 2)
	assert.ErrorIs(t, ptr(got[1]).Err(), syscall.ECANCELED)
	assert.ErrorIs(t, ptr(got[2]).Err(), syscall.ETIME)

	// Does not fire: data is waiting.
	_, err := unix.Write(wr, []byte("ok"))
	require.NoError(t, err)
	ts.Sec = 5
	s = getSQE(t, r)
	s.PrepareRead(rd, buf, 0)
	s.Flags |= SQEIOLink
	s.UserData = 3
	getSQE(t, r).PrepareLinkTimeout(ts)
	r.sqes[(r.sqeTail-1)&r.sqMask].UserData = 4
	got = run(t, r, 2)
	assert.Equal(t, int32(2), got[3].Res)
	assert.ErrorIs(t, ptr(got[4]).Err(), syscall.ECANCELED)
}

func TestAsyncCancel(t *testing.T) {
	r := newRing(t, 8, Options{})
	rd, _ := pipe(t)
	buf := make([]byte, 8)
	s := getSQE(t, r)
	s.PrepareRead(rd, buf, 0)
	s.UserData = 7
	n, err := r.SubmitAndWait(1, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, r.Reap(make([]CQE, 4)), "the read of an empty pipe completed")

	s = getSQE(t, r)
	s.PrepareCancel(7, 0)
	s.UserData = 8
	s = getSQE(t, r)
	s.PrepareCancel(12345, 0)
	s.UserData = 9
	got := run(t, r, 3)
	assert.ErrorIs(t, ptr(got[7]).Err(), syscall.ECANCELED)
	assert.Equal(t, int32(0), got[8].Res)
	assert.ErrorIs(t, ptr(got[9]).Err(), syscall.ENOENT)
}

func TestSQFullIsReported(t *testing.T) {
	r := newRing(t, 4, Options{})
	for range 4 {
		getSQE(t, r).PrepareNop()
	}
	assert.Nil(t, r.GetSQE(), "a fifth SQE would overwrite the first")
	assert.Equal(t, uint32(0), r.SQSpace())
	assert.Equal(t, uint32(4), r.Pending())
	n, err := r.Submit()
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.NotNil(t, r.GetSQE())
}

// TestCQOverflowLosesNothing posts four times as many completions as the CQ
// holds before reaping any.
func TestCQOverflowLosesNothing(t *testing.T) {
	const plain = FlagDeferTaskrun | FlagSingleIssuer
	for _, opts := range []Options{{CQEntries: 8}, {CQEntries: 8, Disable: plain},
		{CQEntries: 8, RawSubmit: true}, {CQEntries: 8, Disable: plain, RawSubmit: true}} {
		r := newRing(t, 8, opts)
		require.NotZero(t, r.Features()&FeatNoDrop)
		const total = 32
		for i := range total {
			s := r.GetSQE()
			if s == nil {
				_, err := r.Submit()
				require.NoError(t, err)
				s = getSQE(t, r)
			}
			s.PrepareNop()
			s.UserData = uint64(i)
		}
		_, err := r.Submit()
		require.NoError(t, err)
		seen := make([]bool, total)
		cqes := make([]CQE, 4)
		count := 0
		for tries := 0; count < total && tries < 1000; tries++ {
			n := r.Reap(cqes)
			if n == 0 {
				_, err := r.SubmitAndWait(1, 100*time.Millisecond)
				require.NoError(t, err)
			}
			for _, c := range cqes[:n] {
				require.False(t, seen[c.UserData], "duplicate %d", c.UserData)
				seen[c.UserData] = true
				count++
			}
		}
		assert.Equal(t, total, count, "flags %v, raw %v", r.Flags(), opts.RawSubmit)
	}
}

func TestCloseTwice(t *testing.T) {
	r, err := New(4, Options{Disable: FlagSingleIssuer | FlagDeferTaskrun})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	assert.Equal(t, -1, r.FD())
}

func TestReapDoesNotAllocate(t *testing.T) {
	r := newRing(t, 64, Options{})
	cqes := make([]CQE, 64)
	allocs := testing.AllocsPerRun(100, func() {
		for range 32 {
			r.GetSQE().PrepareNop()
		}
		if _, err := r.SubmitAndWait(32, -1); err != nil {
			panic(err)
		}
		if n := r.Reap(cqes); n != 32 {
			panic(n)
		}
	})
	assert.Zero(t, allocs)
}

func TestWakeEndsBlockedWait(t *testing.T) {
	r := newRing(t, 8, Options{})
	w, err := NewWaker()
	require.NoError(t, err)
	defer w.Close()
	const wakeData = 99
	w.Arm(getSQE(t, r), wakeData)

	go func() {
		time.Sleep(20 * time.Millisecond)
		assert.NoError(t, w.Wake())
		assert.NoError(t, w.Wake()) // coalesced
	}()
	// No timeout: only the wake can end this wait.
	_, err = r.SubmitAndWait(1, -1)
	require.NoError(t, err)
	cqes := make([]CQE, 4)
	n := r.Reap(cqes)
	require.Equal(t, 1, n)
	assert.Equal(t, uint64(wakeData), cqes[0].UserData)
	assert.Equal(t, int32(8), cqes[0].Res)

	// Re-armed, it wakes again.
	w.Arm(getSQE(t, r), wakeData)
	require.NoError(t, w.Wake())
	got := run(t, r, 1)
	assert.Equal(t, int32(8), got[wakeData].Res)
}

func TestSignalEventfd(t *testing.T) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	require.NoError(t, SignalEventfd(fd))
	require.NoError(t, SignalEventfd(fd))
	var buf [8]byte
	_, err = unix.Read(fd, buf[:])
	require.NoError(t, err)
	assert.Equal(t, uint64(2), binary.NativeEndian.Uint64(buf[:]), "each signal adds 1")
	require.NoError(t, unix.Close(fd))
	assert.ErrorIs(t, SignalEventfd(fd), unix.EBADF)
}

func TestSingleIssuerFromOtherThread(t *testing.T) {
	r := newRing(t, 4, Options{})
	require.NotZero(t, r.Flags()&FlagSingleIssuer)
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // a thread that is certainly not the owner's
		defer runtime.UnlockOSThread()
		r.GetSQE().PrepareNop()
		_, err := r.Submit()
		done <- err
	}()
	err := <-done
	require.Error(t, err)
	assert.ErrorIs(t, err, syscall.EEXIST)
	assert.Contains(t, err.Error(), "LockOSThread")
}

func TestIOWQMaxWorkers(t *testing.T) {
	r := newRing(t, 4, Options{})
	_, _, err := r.SetIOWQMaxWorkers(4, 8)
	require.NoError(t, err)
	b, u, err := r.SetIOWQMaxWorkers(0, 0) // zero reads back without changing
	require.NoError(t, err)
	assert.Equal(t, uint32(4), b)
	assert.Equal(t, uint32(8), u)
}

// TestKernelWritesAfterGC holds a read on a pipe across collections: the
// buffer stays where the kernel will write it.
func TestKernelWritesAfterGC(t *testing.T) {
	r := newRing(t, 4, Options{})
	rd, wr := pipe(t)
	buf := make([]byte, 16)
	s := getSQE(t, r)
	s.PrepareRead(rd, buf, 0)
	s.UserData = 1
	_, err := r.Submit()
	require.NoError(t, err)
	for range 3 {
		runtime.GC()
	}
	_, err = unix.Write(wr, []byte("after gc"))
	require.NoError(t, err)
	got := run(t, r, 1)
	assert.Equal(t, int32(8), got[1].Res)
	assert.Equal(t, "after gc", string(buf[:8]))
	runtime.KeepAlive(buf)
}

// TestOpenat2Resolve checks what the tier relies on: OPENAT2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS refuses a symlink anywhere in the path
// (ELOOP) and a path out of the directory (EXDEV), opens a FIFO with
// O_NONBLOCK without waiting for a writer, and a READ of that FIFO returns
// 0 (end of file: no writer) at once instead of blocking.
func TestOpenat2Resolve(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), []byte("data"))
	require.NoError(t, os.Symlink("f", filepath.Join(dir, "link")))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.Symlink("..", filepath.Join(dir, "sub", "up")))
	require.NoError(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	dfd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(dfd)
	r := newRing(t, 16, Options{})
	require.NoError(t, r.RegisterFilesSparse(4))

	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	paths := []string{"f", "link", "sub/up/f", "../x", "fifo"}
	for i, p := range paths {
		s := getSQE(t, r)
		s.PrepareOpenat2Direct(dfd, cstr(p), how, uint32(i%4))
		s.UserData = uint64(i)
		got := run(t, r, 1)[uint64(i)]
		switch p {
		case "f", "fifo":
			require.NoError(t, got.Err(), p)
		case "link", "sub/up/f":
			require.ErrorIs(t, got.Err(), syscall.ELOOP, p)
		case "../x":
			require.ErrorIs(t, got.Err(), syscall.EXDEV, p)
		}
	}
	// The FIFO is in slot 0 (index 4).
	buf := make([]byte, 64)
	s := getSQE(t, r)
	s.PrepareRead(0, buf, 4096)
	s.Flags |= SQEFixedFile
	s.UserData = 9
	c := run(t, r, 1)[9]
	require.NoError(t, c.Err())
	require.Equal(t, int32(0), c.Res)
}

// TestEventfdAnnouncesDeferredWork checks what the tier's owners rely on to
// sleep outside io_uring_enter: on a DEFER_TASKRUN ring, a registered
// eventfd becomes readable when a completion waits as deferred task work,
// which the next Submit runs (NeedsEnter says so), and then Reap returns it.
func TestEventfdAnnouncesDeferredWork(t *testing.T) {
	r := newRing(t, 8, Options{})
	if r.Flags()&FlagDeferTaskrun == 0 || r.Flags()&FlagTaskrunFlag == 0 {
		t.Skipf("the ring has no DEFER_TASKRUN|TASKRUN_FLAG (flags %v)", r.Flags())
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(efd)
	require.NoError(t, r.RegisterEventfd(efd))

	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	buf := make([]byte, 8)
	s := getSQE(t, r)
	s.PrepareRead(p[0], buf, 0)
	s.UserData = 1
	_, err = r.Submit()
	require.NoError(t, err)
	var ev [8]byte
	unix.Read(efd, ev[:]) // whatever the submit announced
	require.Zero(t, r.Ready(), "the read completed before the pipe had data")

	_, err = unix.Write(p[1], []byte("hi"))
	require.NoError(t, err)
	fds := []unix.PollFd{{Fd: int32(efd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 5000)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the eventfd did not announce the completion")
	require.True(t, r.NeedsEnter(), "deferred task work is pending")
	_, err = r.Submit()
	require.NoError(t, err)
	cqes := make([]CQE, 4)
	require.Equal(t, 1, r.Reap(cqes))
	assert.Equal(t, uint64(1), cqes[0].UserData)
	assert.Equal(t, int32(2), cqes[0].Res)
}

// TestNotifyEventfdToggles checks IORING_CQ_EVENTFD_DISABLED as the tier's
// owners use it: with signals off a completion leaves the eventfd unread,
// and with them on again the next completion signals it.
func TestNotifyEventfdToggles(t *testing.T) {
	r := newRing(t, 8, Options{})
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(efd)
	require.NoError(t, r.RegisterEventfd(efd))
	var ev [8]byte
	nop := func(ud uint64) {
		s := getSQE(t, r)
		s.PrepareNop()
		s.UserData = ud
		require.Equal(t, int32(0), run(t, r, 1)[ud].Res)
	}
	nop(1)
	_, err = unix.Read(efd, ev[:])
	require.NoError(t, err, "a completion with signals on (the default) did not signal")

	require.True(t, r.NotifyEventfd(false), "this kernel has no CQ ring flags")
	nop(2)
	_, err = unix.Read(efd, ev[:])
	require.ErrorIs(t, err, unix.EAGAIN, "a completion signalled with signals off")

	require.True(t, r.NotifyEventfd(true))
	nop(3)
	_, err = unix.Read(efd, ev[:])
	require.NoError(t, err, "a completion with signals on again did not signal")
}

// TestUpdateFilesEmptiesSlots: an open into a slot that holds a file
// replaces it, and UpdateFiles with -1 empties slots.
func TestUpdateFilesEmptiesSlots(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), []byte("x"))
	r := newRing(t, 8, Options{})
	require.NoError(t, r.RegisterFilesSparse(4))
	for i, slot := range []uint32{2, 2, 3} { // the second open replaces the first
		s := getSQE(t, r)
		s.PrepareOpenat2Direct(unix.AT_FDCWD, cstr(filepath.Join(dir, "f")), &unix.OpenHow{Flags: unix.O_PATH}, slot)
		s.UserData = uint64(i)
		require.Equal(t, int32(0), run(t, r, 1)[uint64(i)].Res)
	}
	require.NoError(t, r.UpdateFiles(2, []int32{-1, -1}))
	for _, slot := range []uint32{2, 3} {
		s := getSQE(t, r)
		s.PrepareCloseDirect(slot)
		s.UserData = 9
		assert.ErrorIs(t, ptr(run(t, r, 1)[9]).Err(), syscall.EBADF, "slot %d still holds a file", slot)
	}
}

// TestAllocBufferHugePages: memory of a huge page or more starts on a huge
// page's boundary, is all usable, and, where the kernel has transparent
// huge pages on for madvise, is backed by them; FreeBuffer unmaps it all.
func TestAllocBufferHugePages(t *testing.T) {
	size := 4*HugePage + 5000 // not a multiple of the huge page, nor of the page
	b, err := AllocBuffer(size)
	require.NoError(t, err)
	require.Len(t, b, size)
	start := uintptr(unsafe.Pointer(&b[0]))
	assert.Zero(t, start%HugePage, "starts on a huge page's boundary")
	for i := range b {
		b[i] = byte(i)
	}
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err == nil && !strings.Contains(string(mode), "[never]") {
		assert.GreaterOrEqual(t, anonHugeKB(t, start), HugePage/1024, "transparent huge pages: %s", mode)
	} else {
		t.Logf("transparent huge pages off here (%q): small pages", mode)
	}
	require.NoError(t, FreeBuffer(b))
	assert.Zero(t, anonHugeKB(t, start), "unmapped")

	small, err := AllocBuffer(100)
	require.NoError(t, err)
	assert.Len(t, small, 100)
	assert.Zero(t, uintptr(unsafe.Pointer(&small[0]))%4096)
	require.NoError(t, FreeBuffer(small))
}

// anonHugeKB returns the AnonHugePages of the mapping holding start in
// /proc/self/smaps, 0 if none holds it.
func anonHugeKB(t *testing.T, start uintptr) int {
	smaps, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 {
			in = lo <= start && start < hi
		} else if kb := 0; in && strings.HasPrefix(line, "AnonHugePages:") {
			fmt.Sscanf(strings.TrimPrefix(line, "AnonHugePages:"), "%d", &kb)
			return kb
		}
	}
	return 0
}
