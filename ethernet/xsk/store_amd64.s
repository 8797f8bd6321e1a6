#include "textflag.h"

// func storeRelease(p *uint32, v uint32)
// A MOV is a release store on amd64 (TSO): the same code C compilers
// emit for __atomic_store_n(p, v, __ATOMIC_RELEASE), without the full
// barrier of XCHG that sync/atomic's sequentially consistent Store uses.
TEXT ·storeRelease(SB), NOSPLIT, $0-12
	MOVQ p+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, 0(AX)
	RET
