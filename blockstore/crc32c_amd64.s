#include "textflag.h"

// FOLD moves the 512-bit accumulator acc ahead by the distance Z10's
// constants are for and adds in data (tmp is scratch).
#define FOLD(acc, tmp, data) \
	VPCLMULQDQ $0x00, Z10, acc, tmp; \
	VPCLMULQDQ $0x11, Z10, acc, acc; \
	VPTERNLOGD $0x96, data, tmp, acc

// FOLD128 moves the 128-bit lane acc ahead by 128 bits (X10's constants)
// and adds in the next lane, data.
#define FOLD128(acc, data) \
	VPCLMULQDQ $0x00, X10, acc, X4; \
	VPCLMULQDQ $0x11, X10, acc, acc; \
	VPXOR      X4, acc, acc; \
	VPXOR      data, acc, acc

// func foldCRC(crc uint32, p []byte, k *[6]uint64) uint32
//
// Folds p (a multiple of 64 bytes, at least 64) into one 128-bit piece
// that leaves the CRC where p did, then runs the CRC32 instruction over it.
// Four 512-bit accumulators while 256 bytes are left, then one; k holds
// the constants of updateCRC's foldConsts.
TEXT ·foldCRC(SB), NOSPLIT, $0-44
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), R8

	VMOVDQU64 (SI), Z0
	VMOVD     AX, X8       // zeroes the rest of Z8
	VPXORQ    Z8, Z0, Z0   // the state goes into the first 32 bits
	ADDQ      $64, SI
	SUBQ      $64, CX
	CMPQ      CX, $192
	JB        one

	VMOVDQU64       (SI), Z1
	VMOVDQU64       64(SI), Z2
	VMOVDQU64       128(SI), Z3
	ADDQ            $192, SI
	SUBQ            $192, CX
	VBROADCASTI32X4 (R8), Z10  // 2,048 bits ahead

four:
	CMPQ      CX, $256
	JB        fourDone
	VMOVDQU64 (SI), Z11
	VMOVDQU64 64(SI), Z12
	VMOVDQU64 128(SI), Z13
	VMOVDQU64 192(SI), Z14
	FOLD(Z0, Z4, Z11)
	FOLD(Z1, Z5, Z12)
	FOLD(Z2, Z6, Z13)
	FOLD(Z3, Z7, Z14)
	ADDQ      $256, SI
	SUBQ      $256, CX
	JMP       four

fourDone:
	// Each accumulator into the next, 512 bits ahead.
	VBROADCASTI32X4 16(R8), Z10
	FOLD(Z0, Z4, Z1)
	FOLD(Z0, Z4, Z2)
	FOLD(Z0, Z4, Z3)

one:
	VBROADCASTI32X4 16(R8), Z10  // 512 bits ahead

oneLoop:
	CMPQ      CX, $64
	JB        lanes
	VMOVDQU64 (SI), Z11
	FOLD(Z0, Z4, Z11)
	ADDQ      $64, SI
	SUBQ      $64, CX
	JMP       oneLoop

lanes:
	// Each 128-bit lane into the next, 128 bits ahead.
	VMOVDQU       32(R8), X10
	VEXTRACTI32X4 $1, Z0, X1
	VEXTRACTI32X4 $2, Z0, X2
	VEXTRACTI32X4 $3, Z0, X3
	FOLD128(X0, X1)
	FOLD128(X0, X2)
	FOLD128(X0, X3)

	// X0 is 16 bytes of message whose CRC from a zero state is p's.
	VMOVQ   X0, BX
	VPEXTRQ $1, X0, DX
	VZEROUPPER
	XORL    AX, AX
	CRC32Q  BX, AX
	CRC32Q  DX, AX
	MOVL    AX, ret+40(FP)
	RET
