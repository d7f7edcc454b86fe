package tier

import (
	"sync/atomic"
	"unsafe"

	"github.com/uringtier/uringtier/blockstore"
	"github.com/uringtier/uringtier/uring"
)

// allocBuffers lays out Options.Buffers aligned buffers of BlockSize in
// Options.BufferMemory, or in memory it maps, each in a frame of its own
// (frame), which the io_uring engine registers with every ring where the
// kernel takes a buffer that large.
func (t *Tier) allocBuffers() error {
	if t.opts.Buffers == 0 {
		return nil
	}
	stride := bufferStride(t.opts.BlockSize)
	mem := t.opts.BufferMemory
	if mem == nil {
		var err error
		if mem, err = uring.AllocBuffer(stride * t.opts.Buffers); err != nil {
			return err
		}
	}
	t.bufMem, t.bufStride = mem, stride
	for k := range t.opts.Buffers {
		start := k*stride + blockstore.HeaderSize
		t.buffers = append(t.buffers, mem[start:start+t.opts.BlockSize:start+t.opts.BlockSize])
		if stride <= registeredMax {
			t.frames = append(t.frames, mem[k*stride:(k+1)*stride])
		}
	}
	t.frameBusy = make([]atomic.Bool, len(t.frames))
	t.bufHome = make([]atomic.Uint32, len(t.buffers))
	return nil
}

// registeredMax is the largest buffer the kernel registers (1 GiB; more
// fails with EFAULT). Buffers whose frames are larger stay unregistered:
// loads and stores use them as they use the caller's memory.
const registeredMax = 1 << 30

// BuffersSize is the memory n buffers of blockSize take with their frames:
// what Options.BufferMemory must hold.
func BuffersSize(blockSize, n int) int { return bufferStride(blockSize) * n }

// bufferStride is the distance between two buffers of blockSize: each
// starts aligned for O_DIRECT, HeaderSize bytes into a frame that ends
// HeaderSize bytes after the buffer's last aligned page.
func bufferStride(blockSize int) int {
	return (blockSize+blockstore.HeaderSize-1)/blockstore.HeaderSize*blockstore.HeaderSize + 2*blockstore.HeaderSize
}

// freeBuffers unmaps the buffers once no kernel operation can use them,
// unless they are the caller's (Options.BufferMemory). It leaves t.buffers
// alone, which Buffers may be reading meanwhile; t.bufMem's readers, the
// owners and the submits (dealLoad), are gone.
func (t *Tier) freeBuffers() {
	if t.bufMem != nil && t.opts.BufferMemory == nil {
		uring.FreeBuffer(t.bufMem)
	}
	t.bufMem = nil
}

// Buffers returns the tier's aligned buffers (Options.Buffers of them,
// BlockSize each): the fastest path for loads and stores, registered with
// every ring and suitable for O_DIRECT. The io_uring engine reads a block
// into one with one read whose pages the kernel need not pin, its header
// and what lies past its end landing in memory of the tier's around the
// buffer. They are valid until Close; once Close has been called, Buffers
// returns nil.
func (t *Tier) Buffers() [][]byte {
	if t.closed.Load() {
		return nil
	}
	return t.buffers
}

// bufferAt returns the index of the tier's buffer in whose stride buf
// starts, and buf's offset in bufMem; -1 when buf does not lie in bufMem,
// or lies past the buffers (in a BufferMemory longer than they need).
func (t *Tier) bufferAt(buf []byte) (k, off int) {
	if len(buf) == 0 || !within(buf, t.bufMem) {
		return -1, 0
	}
	off = int(uintptr(unsafe.Pointer(&buf[0])) - uintptr(unsafe.Pointer(&t.bufMem[0])))
	if k = off / t.bufStride; k >= len(t.buffers) {
		return -1, 0
	}
	return k, off
}

// homeOf returns, for dealLoad, 1 + the shard that the last load into
// buf's buffer went to, when buf lies in one of the tier's buffers and
// loads go through the page cache to one of several shards; nil otherwise.
func (t *Tier) homeOf(buf []byte) *atomic.Uint32 {
	if len(t.shards) == 1 || t.engine.Direct {
		return nil
	}
	if k, _ := t.bufferAt(buf); k >= 0 {
		return &t.bufHome[k]
	}
	return nil
}

// frame returns buf's frame for blockstore.Program.Start, and the
// buffer's index, when buf is the start of one of the tier's buffers: a
// load then reads header, payload and past the block's end with one
// READ_FIXED of a registered buffer, whose pages the kernel does not pin
// IO by IO as it does an iovec's. It returns nil otherwise.
func (t *Tier) frame(buf []byte) (int, []byte) {
	k, off := t.bufferAt(buf)
	if k < 0 || len(t.frames) == 0 || off != k*t.bufStride+blockstore.HeaderSize || len(buf)+2*blockstore.HeaderSize > t.bufStride {
		return 0, nil
	}
	return k, t.frames[k][:len(buf)+2*blockstore.HeaderSize]
}
