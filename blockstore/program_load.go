package blockstore

// The load program: open, one read of header (framed format), payload
// and past the end (vectored, or plain into the payload's frame: Start),
// close; or, for a block too big for one read or after the one read
// ended early, a read each for past the end, header and payload, where a
// short read reads on; for a framed payload through the page cache bigger
// than Config.SumChunk, the same with a phase for each part of the
// payload, whose checksum each Judge takes on. Something odd is looked at;
// a corrupt file goes to the quarantine or is removed, as Config.Corrupt
// says.

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// layLoadRest reads the payload from payDone, at most ChunksMax reads (a
// part: Config.SumChunk), then closes if they reach the end. A short read
// stops the chain before the close; the next phase reads on.
func (p *Program) layLoadRest() {
	if p.layChunks(StepRead) == int64(len(p.buf)) {
		p.add(StepClose, roleClose, LinkNone)
	}
}

// judgeLoad judges a load's phase: the outcome, or the next phase (read
// on, look at what is there, quarantine it).
func (p *Program) judgeLoad() bool {
	switch p.phase {
	case phaseQuarantine, phaseRemove:
		p.disposal = CorruptQuarantine
		if p.phase == phaseRemove {
			p.disposal = CorruptRemove
		}
		if r := p.Steps[0].Res; r < 0 {
			p.dispErr = syscall.Errno(-r)
		}
		return p.decide(p.Status, p.Err) // set before the disposal, whatever it did
	case phaseType:
		switch {
		case p.Steps[0].Res < 0:
		case p.Stx.Mode&unix.S_IFMT != unix.S_IFREG:
			p.Status, p.Err, p.moveAway = StatusCorrupt, CheckRegular(uint32(p.Stx.Mode)), true
		case p.short:
			// Judged by the size STATX found, at most what the read of
			// the last page found (the file may have grown since).
			off := p.cfg.Format.PayloadOffset()
			size := min(int64(p.Stx.Size), off+int64(len(p.buf))-HeaderSize)
			p.Status, p.moveAway, p.Err = judgeFile(p.cfg.Format, p.KeyBytes(), p.hdr[:min(p.hdrDone, size)], p.buf[:max(0, min(p.payDone, size-off))], size, false, len(p.buf), nil)
		}
		return p.settleLoad()
	}
	off := p.cfg.Format.PayloadOffset()
	moved, short := false, false
	for k := range p.N {
		s := &p.Steps[k]
		r := s.Res
		read := s.Op == StepRead || s.Op == StepReadv
		switch {
		case r == -int32(unix.ESTALE) && (s.role == roleOpen || read),
			r == -int32(unix.ENOENT) && read:
			// ENOENT from a read of an open file: GlusterFS's answer when
			// another client removed it (evicted or deleted), as ESTALE
			// is NFS's.
			return p.stale()
		case s.role == roleOpen && r == -int32(unix.ENOENT):
			return p.decide(StatusMissing, nil)
		case s.role == roleOpen && r == -int32(unix.ELOOP):
			// Left in place: the link may be a directory on the way, and
			// a rename through it would move someone else's file.
			return p.decide(StatusCorrupt, fmt.Errorf("%w: symlink at block path: %w", ErrCorrupt, p.pathError(StepOpen, p.path[:], syscall.ELOOP)))
		case s.role == roleOpen && odd(r):
			return p.checkType(StatusFailed, p.pathError(StepOpen, p.path[:], syscall.Errno(-r)), false)
		case s.role == roleOpen && r < 0:
			return p.decide(StatusFailed, p.pathError(StepOpen, p.path[:], syscall.Errno(-r)))
		case s.role == roleOpen || s.role == roleClose || r == -int32(unix.ECANCELED):
			// A close's result does not matter to a read; a canceled read
			// did not run (a short read before it stopped the chain).
		case odd(r):
			return p.checkType(StatusFailed, p.pathError(StepRead, p.path[:], syscall.Errno(-r)), false)
		case r < 0:
			return p.decide(StatusFailed, p.pathError(StepRead, p.path[:], syscall.Errno(-r)))
		case s.role == roleTail:
			p.tail, p.tailFull = r, int(r) == len(s.Buf)
		case s.role == roleLast:
			p.short = r == 0
		case s.role == roleWhole:
			want := off + int64(len(p.buf))
			if short = int64(r) < want; !short {
				p.hdrDone, p.payDone, p.tail, p.eof = off, int64(len(p.buf)), int32(int64(r)-want), true
				p.tailFull = int(p.tail) == len(p.past)
			}
		case s.role == roleBody:
			if short = int64(r) < off+int64(len(p.buf)); !short {
				p.hdrDone, p.payDone = off, int64(len(p.buf))
			}
		default:
			moved = moved || r > 0
			if s.role == roleHeader {
				p.hdrDone += int64(r)
			} else {
				p.payDone += int64(r)
			}
			p.eof = p.eof || r == 0
		}
	}
	if p.sumsParts() && p.summed < p.payDone {
		// The part this phase read, while it is still in the cache.
		p.sum, p.summed = UpdateChecksum(p.sum, p.buf[p.summed:p.payDone]), p.payDone
	}
	if short {
		return p.readByStep()
	}
	if p.short {
		// The file ends before the block's last page: the reads of what
		// lies past its end may have counted bytes it does not have.
		end := off + int64(len(p.buf)) - HeaderSize
		return p.checkType(StatusCorrupt, fmt.Errorf("%w: file is at most %d bytes, a block's is %d", ErrCorrupt, end, end+HeaderSize), false)
	}
	if !p.eof && (p.hdrDone < off || p.payDone < int64(len(p.buf))) {
		if !moved || p.Canceled {
			// Nothing read and no end of file: the reads were canceled.
			return p.decide(StatusFailed, p.pathError(StepRead, p.path[:], syscall.ECANCELED))
		}
		p.next(phaseResume)
		return false
	}
	// The file's length as the reads found it: at least that with
	// tailFull.
	size, longer := p.hdrDone, false
	switch {
	case p.hdrDone < off:
	case p.payDone < int64(len(p.buf)):
		size += p.payDone
	default:
		size, longer = size+p.payDone+int64(p.tail), p.tailFull
	}
	var sum *uint32
	if p.sumsParts() && p.summed == p.payDone {
		sum = &p.sum
	}
	st, quarantine, err := judgeFile(p.cfg.Format, p.KeyBytes(), p.hdr[:p.hdrDone], p.buf[:p.payDone], size, longer, len(p.buf), sum)
	if p.hdrDone < off || off == 0 && size < int64(len(p.buf)) {
		// Shorter than a header, or than a raw block: a FIFO or a
		// device reads so too.
		return p.checkType(st, err, quarantine)
	}
	p.Status, p.Err, p.moveAway = st, err, quarantine
	return p.settleLoad()
}

// readByStep loads again with a read each for the part past the end, the
// header and the payload, which read on after a short read: the one read
// ended before the payload did (a file shorter than a block, or a
// filesystem that returned less than it had).
func (p *Program) readByStep() bool {
	if p.Canceled {
		return p.decide(StatusFailed, p.pathError(StepRead, p.path[:], syscall.ECANCELED))
	}
	p.byStep = true
	return p.again()
}

// stale handles an open or read that met ESTALE (or a read ENOENT): on a
// shared filesystem another host replaced or removed the block since this
// host last walked its path. The load starts again from the open, once,
// with a fresh walk (closing the stale file first); a second ESTALE
// reports the block missing, which is what it is to this host, never a
// failure.
func (p *Program) stale() bool {
	if p.retried || p.Canceled {
		return p.decide(StatusMissing, nil)
	}
	p.retried = true
	p.hdrDone, p.payDone, p.eof, p.tail, p.tailFull, p.short = 0, 0, false, 0, false, false
	p.summed, p.sum = 0, 0
	return p.again()
}

// again starts the load over from the open, closing its file first if a
// broken chain left it open.
func (p *Program) again() bool {
	if p.fileOpen {
		p.reopen = true
		p.next(phaseClose)
		return false
	}
	p.next(phaseMain)
	return false
}

// odd reports whether a load's open or read failed in a way that may mean
// no regular file is there: O_DIRECT refused (a directory, a device), a
// directory read, a FIFO read at an offset or with a writer but no data.
func odd(r int32) bool {
	switch -r {
	case int32(unix.EINVAL), int32(unix.EISDIR), int32(unix.EAGAIN), int32(unix.ESPIPE):
		return true
	}
	return false
}

// checkType keeps a load's verdict while a STATX finds out whether a
// regular file is at the block's path; anything else is corrupt (a FIFO,
// a directory, a device) whatever the reads said.
func (p *Program) checkType(st Status, err error, quarantine bool) bool {
	p.Status, p.Err, p.moveAway = st, err, quarantine
	p.next(phaseType)
	return false
}

// settleLoad decides a load with the verdict in Status and Err, first
// moving the file to the quarantine or removing it when the verdict and
// Config.Corrupt say so.
func (p *Program) settleLoad() bool {
	if !p.moveAway {
		return p.decide(p.Status, p.Err)
	}
	switch p.cfg.corrupt() {
	case CorruptRemove:
		p.viaLeaf(phaseRemove)
		return false
	case CorruptQuarantine:
	default:
		return p.decide(p.Status, p.Err)
	}
	q := fmt.Appendf(append(append(append(p.qpath[:0], p.cfg.Quarantine...), '/'), p.cfg.Namespace...), ".%x.%d", p.KeyBytes(), NewTempToken())
	p.qpath[len(q)] = 0 // Config.Check made room
	p.viaLeaf(phaseQuarantine)
	return false
}

// judgeFile applies the format's validity rule (CheckBlock, CheckRaw) and
// says whether a corrupt file is to be disposed of: a framed block of
// another size, whole as its header describes it, is someone else's, not
// damaged; a raw file of the wrong size says nothing of whose it is. With
// longer, the file is size bytes or more (the read past the end filled its
// buffer), and a block larger than blockSize may be whole: it is left too.
// sum, if not nil, is payload's checksum, taken as it was read.
func judgeFile(f Format, key, hdr, payload []byte, size int64, longer bool, blockSize int, sum *uint32) (Status, bool, error) {
	if f == FormatRaw {
		if err := CheckRaw(size, int64(blockSize)); err != nil {
			return StatusCorrupt, true, err
		}
		return StatusLoaded, false, nil
	}
	err := checkBlock(key, hdr, payload, size, sum)
	if err == nil && len(payload) == blockSize {
		return StatusLoaded, false, nil
	}
	h, herr := DecodeHeader(hdr)
	switch {
	case herr != nil:
	case h.PayloadSize != int64(blockSize) && (size == h.FileSize() || longer && h.FileSize() > size):
		return StatusCorrupt, false, fmt.Errorf("%w: payload is %d bytes, the block size is %d", ErrCorrupt, h.PayloadSize, blockSize)
	case longer:
		return StatusCorrupt, true, fmt.Errorf("%w: file is more than %d bytes, header says %d", ErrCorrupt, size, h.FileSize())
	}
	return StatusCorrupt, true, err
}
