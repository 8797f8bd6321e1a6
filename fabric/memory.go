package fabric

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Access is a set of permissions for a registered region, as in
// ibv_reg_mr's access flags and libfabric's FI_READ/FI_WRITE/FI_REMOTE_*.
type Access uint32

// Access flags.
const (
	// AccessLocalWrite lets the local endpoint write into the region: it is
	// needed for receive buffers and for the local side of an RMA read.
	AccessLocalWrite Access = 1 << iota
	// AccessRemoteRead lets the peer read the region with RMA.
	AccessRemoteRead
	// AccessRemoteWrite lets the peer write the region with RMA.
	AccessRemoteWrite
	// AccessRemoteAtomic lets the peer run atomic operations on the region.
	AccessRemoteAtomic
)

// AccessRemote is every remote permission.
const AccessRemote = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic

// Has reports whether a contains every permission in want.
func (a Access) Has(want Access) bool { return a&want == want }

// String lists the flags, such as "local-write|remote-read".
func (a Access) String() string {
	if a == 0 {
		return "none"
	}
	names := [...]string{"local-write", "remote-read", "remote-write", "remote-atomic"}
	s := ""
	for i, n := range names {
		if a&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if rest := a &^ (1<<len(names) - 1); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(rest))
	}
	return s
}

// Key is a memory key. A local key names a region to the local endpoint; a
// remote key authorises a peer's RMA into it. Backends draw remote keys
// from a cryptographic random source, so a peer cannot guess another
// region's key; RoCE keys carry 32 significant bits, others 64.
type Key uint64

// RemoteIOV describes remote memory for RMA, like libfabric's fi_rma_iov:
// an address in the target's RMA address space, a length and the remote
// key that grants access. A region's owner gets it from Region.Remote and
// sends it to the peer (in a message, or out of band); the peer narrows it
// with Slice and passes it in Message.Remote.
//
// Len 0 means the length is not known (protocols that advertise only an
// address and a key): the initiator then checks nothing, and the target's
// bounds check alone applies. Otherwise an RMA longer than Len is refused
// at the initiator with ErrInvalid, on every backend.
type RemoteIOV struct {
	Addr uint64
	Len  uint64
	Key  Key
}

// Slice returns the part [off, off+n) of r. It does not check bounds: the
// target does, and refuses an access outside the region.
func (r RemoteIOV) Slice(off, n uint64) RemoteIOV {
	return RemoteIOV{Addr: r.Addr + off, Len: n, Key: r.Key}
}

// String formats r as "addr+len/key" in hex.
func (r RemoteIOV) String() string {
	return fmt.Sprintf("%#x+%#x/%#x", r.Addr, r.Len, uint64(r.Key))
}

// Region is registered memory: a byte slice that an endpoint may use in
// SGEs, with a local key, a remote key and access flags. Create one with
// Endpoint.Register (caller memory) or Endpoint.Alloc (backend memory).
// Close deregisters it; Close is idempotent. A closed region must not be
// used in new operations, and its memory must not be reused while
// operations that name it are outstanding.
type Region struct {
	buf    []byte
	access Access
	lkey   Key
	rkey   Key
	addr   uint64
	closed atomic.Bool
	once   sync.Once
	dereg  func() error
	err    error
	domain *Domain
}

// RegionConfig is what a backend passes to NewRegion.
type RegionConfig struct {
	// Buf is the registered memory.
	Buf []byte
	// Access is the permission set.
	Access Access
	// LocalKey and RemoteKey are the keys; RemoteKey is zero for a region
	// without remote access.
	LocalKey, RemoteKey Key
	// Addr is the base of the region in the backend's RMA address space
	// (a virtual address for RoCE, a window offset for NTB). Remote
	// accesses name Addr..Addr+len(Buf).
	Addr uint64
	// Domain is the protection domain the region belongs to; backends
	// refuse regions of another domain.
	Domain *Domain
	// Deregister is called once, by the first Close.
	Deregister func() error
}

// NewRegion creates a Region. It is for backend implementations;
// applications get regions from Endpoint.Register and Endpoint.Alloc.
func NewRegion(c RegionConfig) *Region {
	return &Region{buf: c.Buf, access: c.Access, lkey: c.LocalKey, rkey: c.RemoteKey,
		addr: c.Addr, domain: c.Domain, dereg: c.Deregister}
}

// Bytes returns the registered memory. The caller may read and write it
// directly (that is how data gets into send buffers and out of receive
// buffers).
func (r *Region) Bytes() []byte { return r.buf }

// Len is len(r.Bytes()).
func (r *Region) Len() int { return len(r.buf) }

// Access returns the permissions the region was registered with.
func (r *Region) Access() Access { return r.access }

// LocalKey returns the local key (verbs lkey).
func (r *Region) LocalKey() Key { return r.lkey }

// RemoteKey returns the remote key (verbs rkey), zero if the region has no
// remote access.
func (r *Region) RemoteKey() Key { return r.rkey }

// Addr returns the base address of the region in the backend's RMA address
// space.
func (r *Region) Addr() uint64 { return r.addr }

// Domain returns the protection domain of the region.
func (r *Region) Domain() *Domain { return r.domain }

// Domain is a protection domain (verbs PD, libfabric domain): the scope in
// which a region is valid. Endpoints that share a domain share regions;
// an SGE naming a region of another domain is refused. Backends create one
// per device or transport; its identity is all that matters.
type Domain struct {
	// Name describes the domain, for messages.
	Name string
	// HostMemory reports that the backend moves the bytes of local SGEs
	// with the CPU, so that it also accepts regions of HostDomain in the
	// local SGEs of its operations.
	HostMemory bool
}

// HostDomain is the domain of plain host memory registered with
// NewHostRegion.
var HostDomain = &Domain{Name: "host"}

// NewHostRegion describes plain memory as a region of HostDomain: it can
// be the local side of any operation (the source of Send and Write, the
// destination of Recv and Read) on every endpoint whose backend moves
// local bytes with the CPU (Domain.HostMemory: the RoCE engine, NTB,
// AF_XDP), whichever endpoint or connection it goes to. That is what a
// layer over many endpoints, such as fabric/rdm, needs. It has no keys,
// so a peer cannot reach it, and a backend whose device reads memory
// itself (verbs) refuses it with ErrInvalid. Only AccessLocalWrite of
// access is kept.
func NewHostRegion(buf []byte, access Access) *Region {
	return NewRegion(RegionConfig{Buf: buf, Access: access & AccessLocalWrite, Domain: HostDomain})
}

// Remote returns the descriptor of the whole region that a peer needs for
// RMA into it.
func (r *Region) Remote() RemoteIOV {
	return RemoteIOV{Addr: r.addr, Len: uint64(len(r.buf)), Key: r.rkey}
}

// Closed reports whether Close has been called.
func (r *Region) Closed() bool { return r.closed.Load() }

// Close deregisters the region. It is idempotent: later calls return the
// result of the first.
func (r *Region) Close() error {
	r.once.Do(func() {
		r.closed.Store(true)
		if r.dereg != nil {
			r.err = r.dereg()
		}
	})
	return r.err
}

// SGE is a scatter/gather entry: Length bytes at Offset in a registered
// Region (verbs ibv_sge, libfabric iovec plus descriptor).
type SGE struct {
	Region *Region
	Offset int
	Length int
}

// Bytes returns the memory the SGE names, or nil if it is out of the
// region's bounds.
func (s SGE) Bytes() []byte {
	if s.Region == nil || s.Offset < 0 || s.Length < 0 || s.Offset > len(s.Region.buf)-s.Length {
		return nil
	}
	return s.Region.buf[s.Offset : s.Offset+s.Length : s.Offset+s.Length]
}

// SGEOf returns an SGE for the whole region.
func SGEOf(r *Region) SGE { return SGE{Region: r, Length: len(r.buf)} }
