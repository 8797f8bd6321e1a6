//go:build amd64 || arm64

package xsk

// storeRelease stores v to *p with release ordering: every memory access
// before it (the descriptors written or read) is visible before the new
// index. It is an atomic store (single-copy atomic, aligned), the
// counterpart of libxdp's __atomic_store_n(..., __ATOMIC_RELEASE); being
// an assembly function, the compiler cannot move accesses across it.
//
//go:noescape
func storeRelease(p *uint32, v uint32)
