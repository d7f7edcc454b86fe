//go:build !amd64

package blockstore

import "hash/crc32"

// updateCRC extends crc (as hash/crc32.Update) with p.
func updateCRC(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }
