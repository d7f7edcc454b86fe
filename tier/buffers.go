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
	stride := (t.opts.BlockSize + blockstore.HeaderSize - 1) / blockstore.HeaderSize * blockstore.HeaderSize
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

// freeBuffers unmaps the buffers, once no kernel operation can use them.
func (t *Tier) freeBuffers() {
	if t.bufMem != nil {
		uring.FreeBuffer(t.bufMem)
		t.bufMem, t.buffers = nil, nil
	}
}

// Buffers returns the tier's aligned buffers (Options.Buffers of them,
// BlockSize each): the fastest path for loads and stores, registered with
// every ring and suitable for O_DIRECT. They are valid until Close.
func (t *Tier) Buffers() [][]byte { return t.buffers }
