package uring

import "strconv"

// Kernel ABI. Every value and layout below is copied from the kernel's
// include/uapi/linux/io_uring.h (also shipped by liburing as
// src/include/liburing/io_uring.h); the comment on each group names the
// definition it mirrors.

// Setup flags: io_uring_params.flags, "IORING_SETUP_*".
const (
	setupCQSize       = 1 << 3  // IORING_SETUP_CQSIZE (5.5)
	setupClamp        = 1 << 4  // IORING_SETUP_CLAMP (5.6)
	setupSubmitAll    = 1 << 7  // IORING_SETUP_SUBMIT_ALL (5.18)
	setupCoopTaskrun  = 1 << 8  // IORING_SETUP_COOP_TASKRUN (5.19)
	setupTaskrunFlag  = 1 << 9  // IORING_SETUP_TASKRUN_FLAG (5.19)
	setupSingleIssuer = 1 << 12 // IORING_SETUP_SINGLE_ISSUER (6.0)
	setupDeferTaskrun = 1 << 13 // IORING_SETUP_DEFER_TASKRUN (6.1)
	setupNoSQArray    = 1 << 16 // IORING_SETUP_NO_SQARRAY (6.6)
)

// Features: io_uring_params.features, "IORING_FEAT_*".
const (
	featSingleMmap = 1 << 0  // IORING_FEAT_SINGLE_MMAP (5.4)
	featNoDrop     = 1 << 1  // IORING_FEAT_NODROP (5.5)
	featExtArg     = 1 << 8  // IORING_FEAT_EXT_ARG (5.11)
	featCQESkip    = 1 << 11 // IORING_FEAT_CQE_SKIP (5.17)
	featLinkedFile = 1 << 12 // IORING_FEAT_LINKED_FILE (5.17)
)

// mmap offsets: "IORING_OFF_SQ_RING", "IORING_OFF_CQ_RING", "IORING_OFF_SQES".
const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

// SQ ring flags: the word at sq_off.flags, "IORING_SQ_*".
const (
	sqCQOverflow = 1 << 1 // IORING_SQ_CQ_OVERFLOW
	sqTaskrun    = 1 << 2 // IORING_SQ_TASKRUN
)

// CQ ring flags: the word at cq_off.flags, "IORING_CQ_*".
const cqEventfdDisabled = 1 << 0 // IORING_CQ_EVENTFD_DISABLED

// io_uring_enter flags: "IORING_ENTER_*".
const (
	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS
	enterExtArg    = 1 << 3 // IORING_ENTER_EXT_ARG
)

// io_uring_register opcodes: enum io_uring_register_op.
const (
	registerBuffers        = 0  // IORING_REGISTER_BUFFERS
	unregisterBuffers      = 1  // IORING_UNREGISTER_BUFFERS
	registerFiles          = 2  // IORING_REGISTER_FILES
	unregisterFiles        = 3  // IORING_UNREGISTER_FILES
	registerEventfd        = 4  // IORING_REGISTER_EVENTFD
	registerFilesUpdate    = 6  // IORING_REGISTER_FILES_UPDATE
	registerProbe          = 8  // IORING_REGISTER_PROBE
	registerFiles2         = 13 // IORING_REGISTER_FILES2
	registerIOWQMaxWorkers = 19 // IORING_REGISTER_IOWQ_MAX_WORKERS
	rsrcRegisterSparse     = 1  // IORING_RSRC_REGISTER_SPARSE, io_uring_rsrc_register.flags
	probeOpSupported       = 1  // IO_URING_OP_SUPPORTED, io_uring_probe_op.flags
	probeOpsMax            = 256
	sizeofProbeHeader      = 16 // struct io_uring_probe without ops[]
	sizeofProbeOp          = 8  // struct io_uring_probe_op
	sizeofRsrcRegister     = 32 // struct io_uring_rsrc_register
	sizeofGeteventsArg     = 24 // struct io_uring_getevents_arg
	sizeofSQE              = 64 // struct io_uring_sqe
	sizeofCQE              = 16 // struct io_uring_cqe (no IORING_SETUP_CQE32)
	sizeofParams           = 120
	fsyncDatasync          = 1 << 0 // IORING_FSYNC_DATASYNC
)

// Opcode is an io_uring operation: enum io_uring_op.
type Opcode uint8

// Opcodes this package prepares.
const (
	OpNop         Opcode = 0  // IORING_OP_NOP
	OpReadv       Opcode = 1  // IORING_OP_READV
	OpWritev      Opcode = 2  // IORING_OP_WRITEV
	OpFsync       Opcode = 3  // IORING_OP_FSYNC
	OpReadFixed   Opcode = 4  // IORING_OP_READ_FIXED
	OpWriteFixed  Opcode = 5  // IORING_OP_WRITE_FIXED
	OpAsyncCancel Opcode = 14 // IORING_OP_ASYNC_CANCEL
	OpLinkTimeout Opcode = 15 // IORING_OP_LINK_TIMEOUT
	OpOpenat      Opcode = 18 // IORING_OP_OPENAT
	OpClose       Opcode = 19 // IORING_OP_CLOSE
	OpStatx       Opcode = 21 // IORING_OP_STATX
	OpOpenat2     Opcode = 28 // IORING_OP_OPENAT2
	OpRead        Opcode = 22 // IORING_OP_READ
	OpWrite       Opcode = 23 // IORING_OP_WRITE
	OpRenameat    Opcode = 35 // IORING_OP_RENAMEAT
	OpUnlinkat    Opcode = 36 // IORING_OP_UNLINKAT
	OpMkdirat     Opcode = 37 // IORING_OP_MKDIRAT
)

var opcodeNames = [...]string{
	OpNop: "NOP", OpReadv: "READV", OpWritev: "WRITEV", OpFsync: "FSYNC", OpReadFixed: "READ_FIXED", OpWriteFixed: "WRITE_FIXED",
	OpAsyncCancel: "ASYNC_CANCEL", OpLinkTimeout: "LINK_TIMEOUT", OpOpenat: "OPENAT",
	OpClose: "CLOSE", OpStatx: "STATX", OpOpenat2: "OPENAT2", OpRead: "READ", OpWrite: "WRITE",
	OpRenameat: "RENAMEAT", OpUnlinkat: "UNLINKAT", OpMkdirat: "MKDIRAT",
}

// String returns the opcode's name without the IORING_OP_ prefix.
func (op Opcode) String() string {
	if int(op) < len(opcodeNames) && opcodeNames[op] != "" {
		return opcodeNames[op]
	}
	return "OP(" + strconv.Itoa(int(op)) + ")"
}

// SQE flags: io_uring_sqe.flags, "IOSQE_*".
const (
	SQEFixedFile      uint8 = 1 << 0 // IOSQE_FIXED_FILE: fd is an index into the fixed-file table
	SQEIODrain        uint8 = 1 << 1 // IOSQE_IO_DRAIN
	SQEIOLink         uint8 = 1 << 2 // IOSQE_IO_LINK: the next SQE starts only if this one succeeds
	SQEIOHardlink     uint8 = 1 << 3 // IOSQE_IO_HARDLINK: like IO_LINK, but the chain survives failure
	SQEAsync          uint8 = 1 << 4 // IOSQE_ASYNC: go straight to a kernel worker
	SQECQESkipSuccess uint8 = 1 << 6 // IOSQE_CQE_SKIP_SUCCESS: post no CQE when the op succeeds
)

// Cancel flags: io_uring_sqe.cancel_flags, "IORING_ASYNC_CANCEL_*".
const (
	CancelAll = 1 << 0 // IORING_ASYNC_CANCEL_ALL: every request that matches, not just the first
	CancelAny = 1 << 2 // IORING_ASYNC_CANCEL_ANY: match any request
)

// fileIndexAlloc is IORING_FILE_INDEX_ALLOC: let the kernel pick a free fixed slot.
const fileIndexAlloc = ^uint32(0)

// SQE is struct io_uring_sqe (64 bytes). Unions are represented by the
// member this package uses; field comments give the other names.
type SQE struct {
	Opcode      Opcode // opcode
	Flags       uint8  // flags: SQE* constants
	IOPrio      uint16 // ioprio
	FD          int32  // fd (or fixed-file index with SQEFixedFile)
	Off         uint64 // off / addr2
	Addr        uint64 // addr / splice_off_in
	Len         uint32 // len
	OpFlags     uint32 // rw_flags, fsync_flags, open_flags, statx_flags, cancel_flags, rename_flags, unlink_flags, timeout_flags ...
	UserData    uint64 // user_data: returned unchanged in the CQE
	BufIndex    uint16 // buf_index (packed union with buf_group)
	Personality uint16 // personality
	FileIndex   uint32 // file_index / splice_fd_in
	Addr3       uint64 // addr3
	_           uint64 // __pad2[1]
}

// CQE is struct io_uring_cqe (16 bytes, no IORING_SETUP_CQE32).
type CQE struct {
	UserData uint64 // user_data of the SQE this completes
	Res      int32  // result: >= 0 success, -errno failure
	Flags    uint32 // IORING_CQE_F_*
}

// Err returns nil for a successful completion and the errno otherwise.
func (c *CQE) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return errnoErr(-c.Res)
}

// Timespec is struct __kernel_timespec, as LINK_TIMEOUT and EXT_ARG read it.
type Timespec struct {
	Sec  int64
	Nsec int64
}

// sqringOffsets is struct io_sqring_offsets.
type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets.
type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// params is struct io_uring_params (120 bytes).
type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// geteventsArg is struct io_uring_getevents_arg, passed with IORING_ENTER_EXT_ARG.
type geteventsArg struct {
	sigmask   uint64
	sigmaskSz uint32
	minWaitUs uint32 // min_wait_usec (6.12); zero here
	ts        uint64 // pointer to a Timespec
}

// rsrcRegister is struct io_uring_rsrc_register.
type rsrcRegister struct {
	nr    uint32
	flags uint32
	resv2 uint64
	data  uint64
	tags  uint64
}
