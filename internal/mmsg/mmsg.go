//go:build linux

// Package mmsg moves batches of UDP datagrams with recvmmsg(2) and
// sendmmsg(2) on a raw socket descriptor, without allocating: the message
// headers, I/O vectors and socket addresses live in a Batch that the
// caller keeps and reuses.
package mmsg

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Message is one datagram: on receive, Buf is the space to fill and N
// and Addr are set; on send, Buf[:N] goes to Addr.
type Message struct {
	Buf  []byte
	N    int
	Addr netip.AddrPort
}

// Batch holds the kernel-facing arrays for up to Cap messages.
type Batch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	addrs []unix.RawSockaddrInet6 // large enough for IPv4 too
}

// NewBatch allocates a batch for up to n messages.
func NewBatch(n int) *Batch {
	b := &Batch{hdrs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n), addrs: make([]unix.RawSockaddrInet6, n)}
	for i := range b.hdrs {
		h := &b.hdrs[i].Hdr
		h.Iov = &b.iovs[i]
		h.Iovlen = 1
		h.Name = (*byte)(unsafe.Pointer(&b.addrs[i]))
	}
	return b
}

// Cap returns the largest batch.
func (b *Batch) Cap() int { return len(b.hdrs) }

// Recv receives up to min(len(ms), Cap) datagrams from fd without
// blocking. It returns 0 and nil when nothing is queued (EAGAIN).
func (b *Batch) Recv(fd int, ms []Message) (int, error) {
	n := min(len(ms), len(b.hdrs))
	if n == 0 {
		return 0, nil
	}
	for i := 0; i < n; i++ {
		iov := &b.iovs[i]
		iov.Base = unsafe.SliceData(ms[i].Buf)
		iov.Len = uint64(len(ms[i].Buf))
		b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.hdrs[i].Hdr.Flags = 0
	}
	r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])),
		uintptr(n), unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		if errno == unix.EAGAIN || errno == unix.EINTR {
			return 0, nil
		}
		return 0, errno
	}
	for i := 0; i < int(r); i++ {
		ms[i].N = int(b.hdrs[i].Len)
		if b.hdrs[i].Hdr.Flags&unix.MSG_TRUNC != 0 {
			ms[i].N = -1 // truncated: the caller drops it
		}
		ms[i].Addr = parseAddr(&b.addrs[i])
	}
	return int(r), nil
}

// Send sends up to min(len(ms), Cap) datagrams on fd. It returns how many
// the kernel took; 0 and nil when the socket buffer is full (EAGAIN).
func (b *Batch) Send(fd int, ms []Message) (int, error) {
	n := min(len(ms), len(b.hdrs))
	if n == 0 {
		return 0, nil
	}
	for i := 0; i < n; i++ {
		iov := &b.iovs[i]
		iov.Base = unsafe.SliceData(ms[i].Buf)
		iov.Len = uint64(ms[i].N)
		b.hdrs[i].Hdr.Namelen = putAddr(&b.addrs[i], ms[i].Addr)
	}
	r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])),
		uintptr(n), unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		if errno == unix.EAGAIN || errno == unix.EINTR || errno == unix.ENOBUFS {
			return 0, nil
		}
		return 0, errno
	}
	return int(r), nil
}

func parseAddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
	}
	return netip.AddrPort{}
}

func putAddr(sa *unix.RawSockaddrInet6, ap netip.AddrPort) uint32 {
	a := ap.Addr()
	if a.Is4() {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:], ap.Port())
		return unix.SizeofSockaddrInet4
	}
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], ap.Port())
	return unix.SizeofSockaddrInet6
}
