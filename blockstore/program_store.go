package blockstore

// The store program: write a temporary file, sync, close and rename it onto
// the block, after making and checking the directories when a first try did
// not find them; a short write writes on, a failure removes the temporary
// file, DurabilityFull syncs directories.
// A raw store first looks for the block and writes nothing if it is there.

import (
	"bytes"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// layStore lays out a store's first phase: the temporary file and what
// follows it, after, once a first try did not find them, the directories.
func (p *Program) layStore() {
	key, l := p.KeyBytes(), p.cfg.Layout
	tmp := append(l.AppendTempPath(p.tmp[:0], key, NewTempToken()), 0)
	dir := l.AppendDir(p.qpath[:0], key) // qpath is a store's scratch: dirs is built from dir
	if len(tmp) > len(p.tmp) || 2*len(dir)+2 > len(p.dirs) {
		panic("blockstore: block path longer than PathMax") // Start checked the block's path
	}
	unseen := len(dir) > 0 && !p.cfg.Dirs.Known(dir)
	p.unseen = p.unseen || unseen
	if unseen && !p.mkdirs && p.cfg.Guess.makeFirst() {
		p.mkdirs, p.guessed = true, true
	}
	p.tryDirs = unseen && !p.mkdirs
	if unseen && p.mkdirs {
		// A directory not seen yet is usually there (made by another
		// process, or by this one before a restart), and the temporary
		// file's open, which follows no link, is check enough: a first
		// try opens it alone, and only a try that found a level missing,
		// not a directory or a link (ENOENT, ENOTDIR, ELOOP) makes them.
		// tierbench store (64 KiB, O_DIRECT, in a populated tree), 4
		// interleaved rounds against making them every time: 5.3 SQEs a
		// store instead of 10.7 (MKDIRs are handed to kernel workers);
		// io_uring 7.6 k keys/s against 6.3 k and 214 µs of CPU a key
		// against 257; sync engine 192 µs against 217 (medians). In a
		// new tree, where such a directory is usually missing, a first
		// try costs an open and a phase more: Config.Guess has stores
		// make them first there, and a level seen made is not made again
		// (BenchmarkStore, 64 KiB stores into a new tree through the
		// page cache of a tmpfs, one ring: 6.4 SQEs a store instead of
		// 11.9, 3.98 s of CPU for 32,000 stores instead of 6.93).
		//
		// Each level of the directory, "aa\0aa/bb\0", made and then opened
		// without following links: MKDIR follows a link on the way, so a
		// link (or a file) in place of a level stops the chain before
		// anything is made beneath it.
		p.DirHow = unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY, Resolve: ResolveBeneath}
		d := p.dirs[:0]
		for k := range len(dir) {
			if k < len(dir)-1 && (dir[k+1] != '/' || p.cfg.Dirs.Known(dir[:k+1])) {
				continue // not a level's end, or a level seen made and checked
			}
			start := len(d)
			d = append(append(d, dir[:k+1]...), 0)
			s := p.add(StepMkdir, roleMkdir, LinkAlways)
			s.Path, s.dir = &d[start], uint16(start)
			s = p.add(StepOpen, roleDirCheck, LinkOnSuccess)
			s.Path, s.How, s.dir = &d[start], &p.DirHow, uint16(start)
			p.add(StepClose, roleClose, LinkOnSuccess)
		}
	}
	flags := uint64(unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL)
	if p.cfg.Format == FormatRaw {
		flags |= unix.O_TRUNC // as vLLM opens its temporary files
	}
	p.How = unix.OpenHow{Flags: flags, Mode: fileMode, Resolve: ResolveBeneath}
	if p.direct {
		p.How.Flags |= unix.O_DIRECT // offloading must not fill the page cache
	}
	s := p.add(StepOpen, roleOpen, LinkOnSuccess)
	s.Path, s.How = &p.tmp[0], &p.How
	p.layStoreRest()
}

// layExists lays out a raw store's look for its block: a STATX of the
// block's path, after, in a directory not known yet, an open of the
// directory that follows no link. STATX follows links on the way, and a
// link planted in place of a directory would have the store find another
// tree's file there and skip its write.
func (p *Program) layExists() {
	dir := p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes())
	if len(dir) > 0 && !p.cfg.Dirs.Known(dir) {
		p.unseen = true
		if len(dir) >= len(p.dirs) {
			panic("blockstore: block path longer than PathMax") // Start checked the block's path
		}
		dir = append(dir, 0)
		p.DirHow = unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY, Resolve: ResolveBeneath}
		s := p.add(StepOpen, roleDirCheck, LinkOnSuccess)
		s.Path, s.How = &dir[0], &p.DirHow
		p.add(StepClose, roleClose, LinkOnSuccess)
	}
	p.add(StepStatx, roleExists, LinkNone).Path = &p.path[0]
}

// layStoreRest writes what is left of the header and the payload (at most
// ChunksMax payload writes in a phase), then syncs, closes and publishes.
func (p *Program) layStoreRest() {
	off := p.cfg.Format.PayloadOffset()
	switch n := p.hdrDone; {
	case n == 0 && off > 0 && p.payDone == 0 && len(p.buf) > 0 && off+int64(len(p.buf)) <= int64(RWMax):
		// Header and payload in one write: one request instead of two,
		// and one allocation of the file's blocks (an O_DIRECT write of a
		// new file is handed to a kernel worker). A short write writes
		// the rest in the next phase, a write each. tierbench store (64
		// KiB, O_DIRECT), 4 interleaved rounds against a write each:
		// io_uring 1.21x keys/s and 0.86x CPU a key, sync engine 0.79x
		// CPU a key (medians); 2 MiB, 3 rounds: 0.93x CPU a key.
		p.iov[0] = unix.Iovec{Base: &p.hdr[0], Len: uint64(off)}
		p.iov[1] = unix.Iovec{Base: &p.buf[0], Len: uint64(len(p.buf))}
		s := p.add(StepWritev, roleWhole, LinkOnSuccess)
		s.Vec = p.iov[:2]
		p.layPublish()
		return
	case n < off:
		s := p.add(StepWrite, roleHeader, LinkOnSuccess)
		s.Buf, s.Off = p.hdr[n:], n
	}
	if p.layChunks(StepWrite) < int64(len(p.buf)) {
		return // the next phase writes on
	}
	p.layPublish()
}

// layPublish syncs, closes and renames the written temporary file.
func (p *Program) layPublish() {
	if p.cfg.Durability >= DurabilityData {
		p.add(StepFsync, roleSync, LinkOnSuccess).Data = true
	}
	// Close before the rename: on NFS, close reports deferred write
	// errors, and a store whose close failed must not publish.
	p.add(StepClose, roleClose, LinkOnSuccess)
	s := p.add(StepRename, rolePublish, LinkNone)
	s.Path, s.Path2 = &p.tmp[0], &p.path[0]
}

// layDirSync syncs the block's directory, which holds its new name, and
// when the store created directories, or found them there without knowing
// them (another store may have made them and not yet synced their
// parents), each parent too: OPEN ─ FSYNC ═ CLOSE ─ the next directory's
// OPEN. Directories are known only once a store synced them so.
func (p *Program) layDirSync() {
	dirs := append(p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes()), 0)
	if len(dirs) == 1 {
		dirs = append(dirs[:0], '.', 0)
	} else if p.created || p.unseen {
		for k := len(dirs) - 2; k > 0; k-- {
			if dirs[k] == '/' {
				dirs = append(append(dirs, dirs[:k]...), 0)
			}
		}
		dirs = append(dirs, '.', 0)
	}
	p.How = unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY, Resolve: ResolveBeneath}
	for start := 0; start < len(dirs); start += bytes.IndexByte(dirs[start:], 0) + 1 {
		s := p.add(StepOpen, roleOpen, LinkOnSuccess)
		s.Path, s.How = &p.dirs[start], &p.How
		p.add(StepFsync, roleDirSync, LinkAlways).dir = uint16(start)
		p.add(StepClose, roleClose, LinkOnSuccess)
	}
}

// errShort marks a write that moved fewer bytes than it asked for.
var errShort = errors.New("short write")

// firstFailure returns the first step of the phase that failed, other than
// by being canceled behind it, and why; a MKDIR counts unless it succeeded,
// found the directory there (EEXIST) or the check after it found the
// directory (a level removed and made again meanwhile, an NFS MKDIR
// retransmitted): the steps after it then ran, and one of them may have
// created the temporary file.
func (p *Program) firstFailure() (int, error) {
	for k := range p.N {
		s := &p.Steps[k]
		switch {
		case s.Op == StepMkdir && (s.Res >= 0 || s.Res == -int32(unix.EEXIST) || p.Steps[k+1].role == roleDirCheck && p.Steps[k+1].Res >= 0):
		case s.Res < 0:
			return k, syscall.Errno(-s.Res)
		case (s.Op == StepWrite || s.Op == StepWritev) && s.Failed():
			return k, errShort
		}
	}
	return -1, nil
}

// judgeStore judges a store's phase: the outcome, or the next phase (write
// on, retry in a recreated directory, clean up, sync directories).
func (p *Program) judgeStore() bool {
	switch p.phase {
	case phaseExists:
		return p.judgeExists()
	case phaseCleanup:
		return p.decide(StatusFailed, p.cause)
	case phaseDirSync:
		if k, err := p.firstFailure(); k >= 0 {
			s := &p.Steps[k]
			// Steps come in threes, one directory each.
			return p.decide(StatusFailed, p.pathError(s.Op, p.dirs[p.Steps[k/3*3+1].dir:], err.(syscall.Errno)))
		}
		p.rememberDirs()
		return p.decide(StatusStored, nil)
	}
	opened := p.phase == phaseResume // the temporary file exists
	for k := range p.N {
		s := &p.Steps[k]
		switch {
		case s.role == roleOpen:
			opened = s.Res >= 0
		case s.role == roleMkdir && s.Res == 0:
			p.created = true
		case s.Op == StepWritev && s.Res > 0:
			h := min(int64(s.Res), p.cfg.Format.PayloadOffset()-p.hdrDone)
			p.hdrDone += h
			p.payDone += int64(s.Res) - h
		case s.Op == StepWrite && s.Res > 0 && s.role == roleHeader:
			p.hdrDone += int64(s.Res)
		case s.Op == StepWrite && s.Res > 0:
			p.payDone += int64(s.Res)
		}
	}
	last := &p.Steps[p.N-1]
	k, err := p.firstFailure()
	if last.role == rolePublish && last.Res >= 0 {
		k = -1 // published: whatever a MKDIR said, the block is there
	}
	p.teachGuess(k, err)
	if k < 0 && last.role != rolePublish {
		p.next(phaseResume) // every write went through and more remain
		return false
	}
	if err == errShort && p.Steps[k].Res > 0 && !p.Canceled {
		// A short write says nothing about why (a full disk, a signal):
		// write the rest, as write(2) callers do, to learn the errno.
		p.next(phaseResume)
		return false
	}
	if k < 0 {
		if p.cfg.Durability == DurabilityFull {
			p.next(phaseDirSync)
			return false
		}
		p.rememberDirs()
		return p.decide(StatusStored, nil)
	}
	s := &p.Steps[k]
	if s.role == roleOpen && p.tryDirs && !p.Canceled && (err == syscall.ENOENT || err == syscall.ENOTDIR || err == syscall.ELOOP) {
		// The first try, in directories not seen yet, did not find them:
		// make them (or learn which level is not a directory).
		p.mkdirs = true
		p.hdrDone, p.payDone = 0, 0
		p.next(phaseMain)
		return false
	}
	if (s.role == roleOpen || s.role == roleMkdir || s.role == roleDirCheck) && err == syscall.ENOENT && !p.retried && !p.Canceled {
		// A directory is missing (new, or removed under us): create it
		// and try once more.
		p.retried, p.Renew, p.mkdirs = true, true, true
		dir := p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes())
		p.cfg.Dirs.Forget(dir)
		eachParent(dir, p.cfg.Dirs.Forget) // which level went is not known
		p.hdrDone, p.payDone = 0, 0
		p.next(phaseMain)
		return false
	}
	var path []byte
	switch s.role {
	case roleMkdir, roleDirCheck:
		// The first that failed is the cause; the steps after it failed
		// for want of its directory.
		path = p.dirs[s.dir:]
	case rolePublish:
		path = p.path[:]
	default:
		path = p.tmp[:]
	}
	var perr error
	if errno, ok := err.(syscall.Errno); ok {
		perr = p.pathError(s.Op, path, errno)
	} else {
		perr = fmt.Errorf("%w (%w)", p.pathError(s.Op, path, syscall.EIO), err)
	}
	if !opened {
		return p.decide(StatusFailed, perr) // nothing was created
	}
	p.cause = perr
	p.next(phaseCleanup)
	return false
}

// eachParent calls f with each level above the last of dir ("aa" of
// "aa/bb").
// rememberDirs tells the directory cache that the stored block's
// directory is there, and with mkdirs each level of it (made and checked).
func (p *Program) rememberDirs() {
	dir := p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes())
	p.cfg.Dirs.Remember(dir)
	if p.mkdirs {
		eachParent(dir, p.cfg.Dirs.Remember)
	}
}

func eachParent(dir []byte, f func([]byte)) {
	for i := range dir {
		if dir[i] == '/' {
			f(dir[:i])
		}
	}
}

// teachGuess tells Config.Guess what the phase just judged (first
// failing step k, or -1) found of directories not seen yet: a first try's
// open found them or failed for want of them; MKDIRs made first made none
// (each said EEXIST) or some.
func (p *Program) teachGuess(k int, err error) {
	switch {
	case p.tryDirs && p.phase == phaseMain: // the first try: a retry makes them
		if k < 0 || p.Steps[k].role != roleOpen {
			p.cfg.Guess.note(true)
		} else if err == syscall.ENOENT || err == syscall.ENOTDIR || err == syscall.ELOOP {
			p.cfg.Guess.note(false)
		}
	case p.guessed:
		p.guessed = false
		if k < 0 || (p.Steps[k].role != roleMkdir && p.Steps[k].role != roleDirCheck) {
			p.cfg.Guess.note(!p.created)
		}
	}
}

// judgeExists judges a raw store's look at the block's path: a regular
// file of the block size is a block (a raw block has nothing more to
// check), and the store ends StatusPresent without writing, as vLLM's
// skips an existing file; anything else there (a file of another size, a
// symlink) is replaced by the new block's rename, and a missing directory
// is made by the store.
func (p *Program) judgeExists() bool {
	if p.N > 1 { // the directory's open came first
		if p.Steps[0].Res < 0 && !p.Canceled {
			// Missing, or a link or file in place of a level: the store's
			// own directory steps make it or say why not.
			p.mkdirs = true
			p.next(phaseMain)
			return false
		}
		if p.Steps[0].Res >= 0 && p.cfg.Durability != DurabilityFull {
			// With DurabilityFull, only once this store synced its parents.
			p.cfg.Dirs.Remember(p.cfg.Layout.AppendDir(p.dirs[:0], p.KeyBytes()))
		}
	}
	s := &p.Steps[p.N-1]
	switch r := s.Res; {
	case r >= 0 && p.Stx.Mode&unix.S_IFMT == unix.S_IFREG && int64(p.Stx.Size) == int64(len(p.buf)):
		return p.decide(StatusPresent, nil)
	case p.Canceled:
		return p.decide(StatusFailed, p.pathError(StepStatx, p.path[:], syscall.ECANCELED))
	case r >= 0, r == -int32(unix.ENOENT), r == -int32(unix.ENOTDIR):
		p.next(phaseMain)
		return false
	default:
		return p.decide(StatusFailed, p.pathError(StepStatx, p.path[:], syscall.Errno(-r)))
	}
}
