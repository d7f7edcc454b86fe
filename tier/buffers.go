package tier

import (
	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/uring"
)

// allocBuffers allocates Options.Buffers aligned buffers of BlockSize,
// which the io_uring engine registers with every ring.
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
		t.buffers = append(t.buffers, mem[k*stride:k*stride+t.opts.BlockSize:k*stride+t.opts.BlockSize])
	}
	return nil
}

// bufferStride is the distance between two buffers of blockSize: each
// starts aligned for O_DIRECT.
func bufferStride(blockSize int) int {
	return (blockSize + blockstore.HeaderSize - 1) / blockstore.HeaderSize * blockstore.HeaderSize
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
