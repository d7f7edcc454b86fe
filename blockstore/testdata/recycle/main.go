// Command recycle measures what a store costs the filesystem when each
// store comes with an eviction, as in a tier kept at its capacity: a new
// file each (unlink the evicted block's file; create, write and rename the
// new one) against the evicted block's file reused (rename it aside, write
// the new block over it, rename it into place), which allocates no inode
// and, for blocks of one size, no data blocks. Writes are O_DIRECT, from
// -workers goroutines; modes alternate for -rounds rounds. It prints each
// round's stores a second and CPU a store (the process's user+system time).
//
//	go run ./blockstore/testdata/recycle -dir /mnt/ext4/recycle [-size 65536] [-blocks 4096] [-stores 16384]
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	dir := flag.String("dir", "", "an empty directory on the filesystem to measure (created; removed after)")
	size := flag.Int("size", 64<<10, "block size, a multiple of 4096")
	blocks := flag.Int("blocks", 4096, "blocks kept (the capacity)")
	stores := flag.Int("stores", 16384, "stores a round, each evicting the oldest block")
	workers := flag.Int("workers", 16, "goroutines storing at once")
	rounds := flag.Int("rounds", 3, "rounds of each mode, alternating")
	flag.Parse()
	if *dir == "" {
		log.Fatal("-dir is required")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(*dir)
	for r := range *rounds {
		modes := []string{"create", "recycle"}
		if r%2 == 1 {
			modes[0], modes[1] = modes[1], modes[0]
		}
		for _, mode := range modes {
			rate, cpu := run(filepath.Join(*dir, fmt.Sprintf("%s-%d", mode, r)), mode, *size, *blocks, *stores, *workers)
			fmt.Printf("round %d %-7s %8.0f stores/s %6.1f µs of CPU a store\n", r+1, mode, rate, cpu)
		}
	}
}

// run fills dir with blocks, then makes stores more, each evicting the
// oldest, and returns stores a second and µs of CPU a store.
func run(dir, mode string, size, blocks, stores, workers int) (float64, float64) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	name := func(i int) string { return filepath.Join(dir, fmt.Sprintf("b%08d", i)) }
	bufs := make([][]byte, workers)
	for w := range bufs {
		bufs[w] = aligned(size)
	}
	do := func(from, to int, op func(w, i int)) {
		var next atomic.Int64
		next.Store(int64(from))
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1) - 1); i < to; i = int(next.Add(1) - 1) {
					op(w, i)
				}
			}()
		}
		wg.Wait()
	}
	write := func(path string, flags int, buf []byte) {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC|flags, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		if n, err := unix.Pwrite(fd, buf, 0); err != nil || n != len(buf) {
			log.Fatalf("write %s: %d, %v", path, n, err)
		}
		unix.Close(fd)
	}
	create := func(w, i int) {
		tmp := name(i) + ".tmp"
		write(tmp, unix.O_CREAT|unix.O_EXCL, bufs[w])
		if err := unix.Rename(tmp, name(i)); err != nil {
			log.Fatal(err)
		}
	}
	do(0, blocks, create)
	unix.Sync()
	store := func(w, i int) { // block i in, block i-blocks out
		old := name(i - blocks)
		if mode == "create" {
			if err := unix.Unlink(old); err != nil {
				log.Fatal(err)
			}
			create(w, i)
			return
		}
		tmp := name(i) + ".tmp"
		if err := unix.Rename(old, tmp); err != nil {
			log.Fatal(err)
		}
		write(tmp, 0, bufs[w])
		if err := unix.Rename(tmp, name(i)); err != nil {
			log.Fatal(err)
		}
	}
	cpu0, t0 := cpuTime(), time.Now()
	// In waves of blocks: store i evicts block i-blocks, which the wave
	// before made, so no store waits for one still being written.
	for from := blocks; from < blocks+stores; from += blocks {
		do(from, min(from+blocks, blocks+stores), store)
	}
	wall, cpu := time.Since(t0), cpuTime()-cpu0
	return float64(stores) / wall.Seconds(), float64(cpu.Microseconds()) / float64(stores)
}

func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		log.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// aligned returns n bytes at a 4,096-byte boundary, as O_DIRECT wants.
func aligned(n int) []byte {
	b := make([]byte, n+4096)
	off := (4096 - int(uintptr(unsafe.Pointer(&b[0]))%4096)) % 4096
	b = b[off : off+n]
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}
