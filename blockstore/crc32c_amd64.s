#include "textflag.h"

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
	CMPQ       CX, $256
	JB         fourDone
	VPCLMULQDQ $0x00, Z10, Z0, Z4
	VPCLMULQDQ $0x11, Z10, Z0, Z0
	VPCLMULQDQ $0x00, Z10, Z1, Z5
	VPCLMULQDQ $0x11, Z10, Z1, Z1
	VPCLMULQDQ $0x00, Z10, Z2, Z6
	VPCLMULQDQ $0x11, Z10, Z2, Z2
	VPCLMULQDQ $0x00, Z10, Z3, Z7
	VPCLMULQDQ $0x11, Z10, Z3, Z3
	VMOVDQU64  (SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	VPTERNLOGD $0x96, Z11, Z4, Z0  // Z0 ^= Z4 ^ Z11
	VPTERNLOGD $0x96, Z12, Z5, Z1
	VPTERNLOGD $0x96, Z13, Z6, Z2
	VPTERNLOGD $0x96, Z14, Z7, Z3
	ADDQ       $256, SI
	SUBQ       $256, CX
	JMP        four

fourDone:
	// Each accumulator into the next, 512 bits ahead.
	VBROADCASTI32X4 16(R8), Z10
	VPCLMULQDQ      $0x00, Z10, Z0, Z4
	VPCLMULQDQ      $0x11, Z10, Z0, Z0
	VPTERNLOGD      $0x96, Z1, Z4, Z0
	VPCLMULQDQ      $0x00, Z10, Z0, Z4
	VPCLMULQDQ      $0x11, Z10, Z0, Z0
	VPTERNLOGD      $0x96, Z2, Z4, Z0
	VPCLMULQDQ      $0x00, Z10, Z0, Z4
	VPCLMULQDQ      $0x11, Z10, Z0, Z0
	VPTERNLOGD      $0x96, Z3, Z4, Z0

one:
	VBROADCASTI32X4 16(R8), Z10  // 512 bits ahead

oneLoop:
	CMPQ       CX, $64
	JB         lanes
	VMOVDQU64  (SI), Z11
	VPCLMULQDQ $0x00, Z10, Z0, Z4
	VPCLMULQDQ $0x11, Z10, Z0, Z0
	VPTERNLOGD $0x96, Z11, Z4, Z0
	ADDQ       $64, SI
	SUBQ       $64, CX
	JMP        oneLoop

lanes:
	// Each 128-bit lane into the next, 128 bits ahead.
	VMOVDQU       32(R8), X10
	VEXTRACTI32X4 $1, Z0, X1
	VEXTRACTI32X4 $2, Z0, X2
	VEXTRACTI32X4 $3, Z0, X3
	VPCLMULQDQ    $0x00, X10, X0, X4
	VPCLMULQDQ    $0x11, X10, X0, X0
	VPXOR         X4, X0, X0
	VPXOR         X1, X0, X0
	VPCLMULQDQ    $0x00, X10, X0, X4
	VPCLMULQDQ    $0x11, X10, X0, X0
	VPXOR         X4, X0, X0
	VPXOR         X2, X0, X0
	VPCLMULQDQ    $0x00, X10, X0, X4
	VPCLMULQDQ    $0x11, X10, X0, X0
	VPXOR         X4, X0, X0
	VPXOR         X3, X0, X0

	// X0 is 16 bytes of message whose CRC from a zero state is p's.
	VMOVQ      X0, BX
	VPEXTRQ    $1, X0, DX
	VZEROUPPER
	XORL       AX, AX
	CRC32Q     BX, AX
	CRC32Q     DX, AX
	MOVL       AX, ret+40(FP)
	RET
