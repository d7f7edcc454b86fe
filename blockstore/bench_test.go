package blockstore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

const benchBlockSize = 2 << 20

// BenchmarkEncode measures EncodeHeader, which is one CRC32C pass over the
// payload plus one over the 4 KiB header; ms/GiB is the cost per GiB.
func BenchmarkEncode(b *testing.B) {
	for _, size := range []int{64 << 10, benchBlockSize} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			key := testKey(1, 32)
			payload := testPayload(key, size)
			hdr := make([]byte, HeaderSize)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				EncodeHeader(hdr, key, payload)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)*float64(1<<30)/float64(size)/1e6, "ms/GiB")
		})
	}
}

// BenchmarkCheck measures CheckBlock, what every read pays.
func BenchmarkCheck(b *testing.B) {
	key := testKey(1, 32)
	payload := testPayload(key, benchBlockSize)
	hdr := make([]byte, HeaderSize)
	EncodeHeader(hdr, key, payload)
	b.SetBytes(benchBlockSize)
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckBlock(key, hdr, payload, HeaderSize+int64(len(payload))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWrite compares Put of a 2 MiB block (temporary file, rename,
// DurabilityNone) with a plain write of the same bytes to one file.
func BenchmarkWrite(b *testing.B) {
	key := testKey(1, 32)
	payload := testPayload(key, benchBlockSize)
	b.Run("op=put", func(b *testing.B) {
		s, err := Open(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchBlockSize)
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Put("ns", key, payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("op=raw", func(b *testing.B) {
		p := filepath.Join(b.TempDir(), "raw")
		data := append(make([]byte, HeaderSize), payload...)
		b.SetBytes(benchBlockSize)
		b.ReportAllocs()
		for b.Loop() {
			if err := os.WriteFile(p, data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRead compares Get of a 2 MiB block (open, header, payload,
// checks) with a plain open and read of the same bytes.
func BenchmarkRead(b *testing.B) {
	key := testKey(1, 32)
	payload := testPayload(key, benchBlockSize)
	buf := make([]byte, benchBlockSize)
	b.Run("op=get", func(b *testing.B) {
		s, err := Open(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Put("ns", key, payload); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchBlockSize)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Get("ns", key, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("op=raw", func(b *testing.B) {
		p := filepath.Join(b.TempDir(), "raw")
		if err := os.WriteFile(p, append(make([]byte, HeaderSize), payload...), 0o644); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchBlockSize)
		b.ReportAllocs()
		for b.Loop() {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.ReadAt(buf, HeaderSize); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
}
