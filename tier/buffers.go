package tier

import (
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/uring"
)

// allocBuffers allocates Options.Buffers aligned buffers of BlockSize,
// which the io_uring engine registers with every ring. Each has
// HeaderSize bytes in front of it, in the same registered buffer
// (bufRegion): a store from it puts its header there and writes header
// and payload as one WRITE_FIXED, whose pages the kernel pinned once, at
// registration, instead of at every write (headerSlot).
func (t *Tier) allocBuffers() error {
	if t.opts.Buffers == 0 {
		return nil
	}
	stride := bufferStride(t.opts.BlockSize)
	mem, err := uring.AllocBuffer(stride * t.opts.Buffers)
	if err != nil {
		return err
	}
	t.bufMem, t.bufStride = mem, stride
	for k := range t.opts.Buffers {
		b := mem[k*stride+blockstore.HeaderSize:]
		t.buffers = append(t.buffers, b[:t.opts.BlockSize:t.opts.BlockSize])
	}
	return nil
}

// bufferStride is the distance between two buffers of blockSize, each
// with its header slot: each starts aligned for O_DIRECT.
func bufferStride(blockSize int) int {
	return blockstore.HeaderSize + (blockSize+blockstore.HeaderSize-1)/blockstore.HeaderSize*blockstore.HeaderSize
}

// bufRegion returns buffer k with its header slot: what the io_uring
// engine registers.
func (t *Tier) bufRegion(k int) []byte {
	return t.bufMem[k*t.bufStride : (k+1)*t.bufStride]
}

// headerSlot returns the HeaderSize bytes in front of buf when buf starts
// one of the tier's buffers, else nil. Only the op that has the buffer
// writes there.
func (t *Tier) headerSlot(buf []byte) []byte {
	if !within(buf, t.bufMem) {
		return nil
	}
	off := int(uintptr(unsafe.Pointer(&buf[0])) - uintptr(unsafe.Pointer(&t.bufMem[0])))
	if off%t.bufStride != blockstore.HeaderSize {
		return nil
	}
	return t.bufMem[off-blockstore.HeaderSize : off : off]
}

// freeBuffers unmaps the buffers once no kernel operation can use them. It
// leaves t.buffers alone, which Buffers may be reading meanwhile; the
// owners, the only readers of t.bufMem, are gone.
func (t *Tier) freeBuffers() {
	if t.bufMem != nil {
		uring.FreeBuffer(t.bufMem)
		t.bufMem = nil
	}
}

// Buffers returns the tier's aligned buffers (Options.Buffers of them,
// BlockSize each): the fastest path for loads and stores, registered with
// every ring and suitable for O_DIRECT. They are valid until Close; once
// Close has been called, Buffers returns nil.
func (t *Tier) Buffers() [][]byte {
	if t.closed.Load() {
		return nil
	}
	return t.buffers
}
