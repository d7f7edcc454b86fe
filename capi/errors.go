package main

// #include "uringtier.h"
// void ut__seterr(char *msg, size_t n);
// static int ut__ok_status(int s) { return UT_OK_STATUS(s); }
import "C"

import (
	"errors"
	"unsafe"

	"github.com/uringtier/uringtier/tier"
)

// Errors of the C layer itself; the tier's own sentinels map to the other
// codes (see code).
var (
	// errArg marks a NULL pointer or an impossible length (UT_EARG).
	errArg = errors.New("uringtier: bad argument")
	// errHandle marks a handle that is not a live tier (UT_EHANDLE).
	errHandle = errors.New("uringtier: not a tier handle, or one already freed")
	// errRange marks a result larger than the caller's status array (UT_ERANGE).
	errRange = errors.New("uringtier: status array too small")
)

// code maps err to the header's error code; it is the only place that
// does.
func code(err error) C.int {
	switch {
	case err == nil:
		return C.UT_OK
	case errors.Is(err, tier.ErrBusy):
		return C.UT_EBUSY
	case errors.Is(err, tier.ErrClosed):
		return C.UT_ECLOSED
	case errors.Is(err, tier.ErrInvalidOptions):
		return C.UT_EOPTIONS
	case errors.Is(err, tier.ErrInvalid):
		return C.UT_EINVAL
	case errors.Is(err, tier.ErrStuck):
		return C.UT_ESTUCK
	case errors.Is(err, errHandle):
		return C.UT_EHANDLE
	case errors.Is(err, errArg):
		return C.UT_EARG
	case errors.Is(err, errRange):
		return C.UT_ERANGE
	case errors.Is(err, tier.ErrBroken):
		return C.UT_EBROKEN
	}
	return C.UT_EIO
}

// fail records err's message as this thread's last error and returns its
// code. A Go function exported to C runs on the calling C thread, so the
// message lands in that thread's buffer.
func fail(err error) C.int {
	msg := err.Error()
	C.ut__seterr((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	return code(err)
}

// The header's enums must equal the tier's: a mismatch fails compilation
// with "invalid array index".
func _() {
	var x [1]struct{}
	_ = x[int(C.UT_OP_LOOKUP)-int(tier.OpLookup)]
	_ = x[int(C.UT_OP_LOAD)-int(tier.OpLoad)]
	_ = x[int(C.UT_OP_STORE)-int(tier.OpStore)]
	_ = x[int(C.UT_OP_RELEASE)-int(tier.OpRelease)]
	_ = x[int(C.UT_OP_DELETE)-int(tier.OpDelete)]
	_ = x[int(C.UT_PENDING)-int(tier.StatusPending)]
	_ = x[int(C.UT_FOUND)-int(tier.StatusFound)]
	_ = x[int(C.UT_LOADED)-int(tier.StatusLoaded)]
	_ = x[int(C.UT_STORED)-int(tier.StatusStored)]
	_ = x[int(C.UT_PRESENT)-int(tier.StatusPresent)]
	_ = x[int(C.UT_MISSING)-int(tier.StatusMissing)]
	_ = x[int(C.UT_CORRUPT)-int(tier.StatusCorrupt)]
	_ = x[int(C.UT_TIMEDOUT)-int(tier.StatusTimedOut)]
	_ = x[int(C.UT_FAILED)-int(tier.StatusFailed)]
	_ = x[int(C.UT_CANCELED)-int(tier.StatusCanceled)]
	_ = x[int(C.UT_SKIPPED)-int(tier.StatusSkipped)]
	_ = x[int(C.UT_DELETED)-int(tier.StatusDeleted)]
	_ = x[int(C.UT_FULL)-int(tier.StatusFull)]
	_ = x[int(unsafe.Sizeof(C.ut_result{}))-32]
}

// okStatus is the header's UT_OK_STATUS(s), for the test that holds it to
// tier.Status.OK.
func okStatus(s int) bool { return C.ut__ok_status(C.int(s)) != 0 }

// utEOptions, utEIO and utEBroken are UT_EOPTIONS, UT_EIO and UT_EBROKEN
// for the tests, which cannot use cgo.
const (
	utEOptions = int(C.UT_EOPTIONS)
	utEIO      = int(C.UT_EIO)
	utEBroken  = int(C.UT_EBROKEN)
)
