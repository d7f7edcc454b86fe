package uring

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkNopBatch is the round trip of a batch of NOPs: prepare, one
// io_uring_enter, reap.
func BenchmarkNopBatch(b *testing.B) {
	for _, batch := range []int{1, 32, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			r := newRing(b, uint32(batch), Options{})
			cqes := make([]CQE, batch)
			b.ReportAllocs()
			for b.Loop() {
				for range batch {
					r.GetSQE().PrepareNop()
				}
				if _, err := r.SubmitAndWait(uint32(batch), -1); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < batch; got += r.Reap(cqes) {
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// statxFixture makes n paths under a fresh directory, every other one an
// existing file, and returns them NUL-terminated.
func statxFixture(b *testing.B, n int) (paths [][]byte, dir string) {
	dir = b.TempDir()
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("%02x", i%256), fmt.Sprintf("blk%06d", i))
		if i%2 == 0 {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		paths = append(paths, append([]byte(p), 0))
	}
	return paths, dir
}

// submitAndReap submits what is prepared and reaps want completions.
func submitAndReap(b *testing.B, r *Ring, cqes []CQE, want int) {
	if _, err := r.SubmitAndWait(uint32(want), -1); err != nil {
		b.Fatal(err)
	}
	for got := 0; got < want; {
		k := r.Reap(cqes)
		if k == 0 {
			if _, err := r.SubmitAndWait(1, -1); err != nil {
				b.Fatal(err)
			}
		}
		got += k
	}
}

// BenchmarkStatx1024 checks 1,024 paths, half present, with a warm dentry
// cache: io_uring STATX, io_uring OPENAT(O_PATH) into fixed slots with a
// linked CLOSE, a plain unix.Statx loop, and a pool of goroutines.
func BenchmarkStatx1024(b *testing.B) {
	const n = 1024
	paths, _ := statxFixture(b, n)
	names := make([]string, n) // the plain loops get Go strings, built once
	for i, p := range paths {
		names[i] = string(p[:len(p)-1])
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "paths/s")
	}

	b.Run("engine=uring-statx", func(b *testing.B) {
		r := newRing(b, n, Options{CQEntries: 2 * n})
		stx := make([]unix.Statx_t, n)
		cqes := make([]CQE, n)
		b.ReportAllocs()
		for b.Loop() {
			for i := range n {
				s := r.GetSQE()
				s.PrepareStatx(unix.AT_FDCWD, &paths[i][0], 0, unix.STATX_SIZE, &stx[i])
				s.UserData = uint64(i)
			}
			submitAndReap(b, r, cqes, n)
		}
		report(b)
	})

	b.Run("engine=uring-openat-path", func(b *testing.B) {
		r := newRing(b, 2*n, Options{CQEntries: 4 * n})
		if err := r.RegisterFilesSparse(n); err != nil {
			b.Fatal(err)
		}
		cqes := make([]CQE, 2*n)
		b.ReportAllocs()
		for b.Loop() {
			for i := range n {
				s := r.GetSQE()
				s.PrepareOpenatDirect(unix.AT_FDCWD, &paths[i][0], unix.O_PATH, 0, uint32(i))
				s.Flags |= SQEIOLink
				s.UserData = uint64(i)
				s = r.GetSQE()
				s.PrepareCloseDirect(uint32(i))
				s.Flags |= SQECQESkipSuccess
				s.UserData = uint64(i) | 1<<63
			}
			// Present: one CQE (open). Missing: two (open ENOENT, close canceled).
			submitAndReap(b, r, cqes, n+n/2)
		}
		report(b)
	})

	b.Run("engine=statx-loop", func(b *testing.B) {
		var st unix.Statx_t
		b.ReportAllocs()
		for b.Loop() {
			for i := range n {
				_ = unix.Statx(unix.AT_FDCWD, names[i], 0, unix.STATX_SIZE, &st)
			}
		}
		report(b)
	})

	b.Run("engine=statx-pool16", func(b *testing.B) {
		const workers = 16
		b.ReportAllocs()
		for b.Loop() {
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					var st unix.Statx_t
					for i := w; i < n; i += workers {
						_ = unix.Statx(unix.AT_FDCWD, names[i], 0, unix.STATX_SIZE, &st)
					}
				})
			}
			wg.Wait()
		}
		report(b)
	})
}

// BenchmarkReadDirect reads random aligned blocks of a 256 MiB file with
// O_DIRECT: io_uring READ_FIXED at depth 32 into registered buffers against
// a pread loop.
func BenchmarkReadDirect(b *testing.B) {
	const fileSize = 256 << 20
	path := filepath.Join(b.TempDir(), "data")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for off := 0; off < fileSize; off += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Skipf("O_DIRECT: %v", err)
	}
	defer unix.Close(fd)

	for _, size := range []int{4 << 10, 2 << 20} {
		depth := 32
		if size > 64<<10 {
			depth = 4
		}
		offsets := func(rng *rand.Rand) uint64 { return uint64(rng.IntN(fileSize/size)) * uint64(size) }

		b.Run(fmt.Sprintf("size=%d/engine=uring-fixed/depth=%d", size, depth), func(b *testing.B) {
			r := newRing(b, uint32(depth), Options{})
			bufs := make([][]byte, depth)
			for i := range bufs {
				if bufs[i], err = AllocBuffer(size); err != nil {
					b.Fatal(err)
				}
				defer FreeBuffer(bufs[i])
			}
			if err := r.RegisterBuffers(bufs); err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			cqes := make([]CQE, depth)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			inflight := 0
			for b.Loop() {
				// Keep depth reads in flight; each loop iteration is one read.
				for inflight < depth {
					s := r.GetSQE()
					i := inflight
					s.PrepareReadFixed(fd, bufs[i], offsets(rng), uint16(i))
					s.UserData = uint64(i)
					inflight++
				}
				if _, err := r.SubmitAndWait(1, -1); err != nil {
					b.Fatal(err)
				}
				k := r.Reap(cqes[:1])
				for _, c := range cqes[:k] {
					if c.Res != int32(size) {
						b.Fatalf("read %d", c.Res)
					}
					s := r.GetSQE()
					s.PrepareReadFixed(fd, bufs[c.UserData], offsets(rng), uint16(c.UserData))
					s.UserData = c.UserData
				}
			}
			for inflight = depth; inflight > 0; {
				if _, err := r.SubmitAndWait(1, -1); err != nil {
					b.Fatal(err)
				}
				inflight -= r.Reap(cqes)
			}
		})

		b.Run(fmt.Sprintf("size=%d/engine=pread/depth=1", size), func(b *testing.B) {
			buf, err := AllocBuffer(size)
			if err != nil {
				b.Fatal(err)
			}
			defer FreeBuffer(buf)
			rng := rand.New(rand.NewPCG(1, 2))
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if n, err := unix.Pread(fd, buf, int64(offsets(rng))); n != size || err != nil {
					b.Fatal(n, err)
				}
			}
		})

		b.Run(fmt.Sprintf("size=%d/engine=pread/depth=%d", size, depth), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			var mu sync.Mutex
			b.SetBytes(int64(size))
			b.SetParallelism((depth + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				buf, err := AllocBuffer(size)
				if err != nil {
					panic(err)
				}
				defer FreeBuffer(buf)
				for pb.Next() {
					mu.Lock()
					off := offsets(rng)
					mu.Unlock()
					if n, err := unix.Pread(fd, buf, int64(off)); n != size || err != nil {
						panic(fmt.Sprint(n, err))
					}
				}
			})
		})
	}
}
