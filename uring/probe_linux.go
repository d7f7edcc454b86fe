package uring

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RequiredOps are the opcodes the storage tier needs. RENAMEAT and
// UNLINKAT arrived in 5.11, MKDIRAT in 5.15; sparse fixed-file tables and
// their CLOSE in 5.19, which is why that is the minimum for this path.
var RequiredOps = []Opcode{OpNop, OpStatx, OpOpenat, OpOpenat2, OpClose, OpRead, OpReadv, OpWrite, OpWritev, OpReadFixed, OpWriteFixed,
	OpFsync, OpRenameat, OpUnlinkat, OpMkdirat, OpLinkTimeout, OpAsyncCancel}

// Probe reports which opcodes the kernel supports (IORING_REGISTER_PROBE).
type Probe struct {
	ops [probeOpsMax]bool
}

// Supports reports whether op is supported.
func (p *Probe) Supports(op Opcode) bool { return p.ops[op] }

// Probe asks the kernel which opcodes this ring supports.
func (r *Ring) Probe() (*Probe, error) {
	// struct io_uring_probe followed by probeOpsMax struct io_uring_probe_op.
	buf := make([]byte, sizeofProbeHeader+probeOpsMax*sizeofProbeOp)
	if err := r.register(registerProbe, unsafe.Pointer(&buf[0]), probeOpsMax); err != nil {
		return nil, fmt.Errorf("uring: IORING_REGISTER_PROBE: %w", err)
	}
	p := &Probe{}
	opsLen := int(buf[1])
	for i := 0; i < opsLen; i++ {
		op := buf[sizeofProbeHeader+i*sizeofProbeOp:]
		flags := uint16(op[2]) | uint16(op[3])<<8
		p.ops[op[0]] = flags&probeOpSupported != 0
	}
	return p, nil
}

// Available reports whether io_uring can be used here with every opcode in
// RequiredOps and IOSQE_CQE_SKIP_SUCCESS. The error is an *UnavailableError
// that says why and what to do about it. It creates and closes one small
// ring.
func Available() error {
	r, err := New(2, Options{Disable: FlagSingleIssuer | FlagDeferTaskrun})
	if err != nil {
		return err
	}
	defer r.Close()
	p, err := r.Probe()
	if err != nil {
		return &UnavailableError{Err: err, Reason: "the kernel cannot report its opcodes (IORING_REGISTER_PROBE needs Linux 5.6); use Linux 5.19 or newer"}
	}
	var missing []Opcode
	for _, op := range RequiredOps {
		if !p.Supports(op) {
			missing = append(missing, op)
		}
	}
	if len(missing) > 0 {
		return &UnavailableError{Missing: missing, Reason: "the kernel lacks opcodes the tier needs; use Linux 5.19 or newer"}
	}
	if r.Features()&FeatCQESkip == 0 {
		return &UnavailableError{Reason: "the kernel lacks IOSQE_CQE_SKIP_SUCCESS (Linux 5.17), which the tier's linked steps use; use Linux 5.19 or newer"}
	}
	return nil
}

// register calls io_uring_register, retrying EINTR.
func (r *Ring) register(op uintptr, arg unsafe.Pointer, nrArgs uintptr) error {
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), op, uintptr(arg), nrArgs, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return errnoErr(int32(errno))
	}
}
