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
	// Seg is set by RecvSegments: the size of the datagrams the message
	// holds, or 0 if it is one datagram.
	Seg int
}

// Batch holds the kernel-facing arrays for up to Cap messages.
type Batch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	addrs []unix.RawSockaddrInet6 // large enough for IPv4 too

	segIovs []unix.Iovec // SendSegments: MaxSegments for each message
	ctrl    []byte       // SendSegments: a control message for each message
	rctrl   []byte       // RecvSegments: room for a control message each
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

// MaxSegments is the most datagrams SendSegments puts in one message
// (the kernel's limit, UDP_MAX_SEGMENTS, is 64 before Linux 5.8 and 128
// from then on).
const MaxSegments = 64

// MaxSegmented is the most bytes of UDP payload in one segmented message:
// what an IPv4 datagram can hold, less the IPv6 header's difference.
const MaxSegmented = 65535 - 40 - 8

// Group is one segmented message: the datagrams Segs, each a whole UDP
// payload, of which all but the last have the same length and the last is
// not longer, go to Addr in one system call, the kernel cutting them
// apart again (UDP_SEGMENT, "UDP GSO"), or not at all where the path
// leads to a socket that takes them whole (UDP_GRO).
type Group struct {
	Segs [][]byte
	Addr netip.AddrPort
}

// segControl is the control message of a segmented send: UDP_SEGMENT
// with the segment size.
const segControl = unix.SizeofCmsghdr + 8 // CMSG_SPACE(sizeof(uint16))

// SendSegments sends up to min(len(gs), Cap) groups on fd, each in one
// message: a group of one datagram as sendmmsg would send it, a longer
// one with UDP_SEGMENT. It returns how many groups the kernel took; 0 and
// nil when the socket buffer is full.
func (b *Batch) SendSegments(fd int, gs []Group) (int, error) {
	n := min(len(gs), len(b.hdrs))
	if n == 0 {
		return 0, nil
	}
	if b.segIovs == nil {
		b.segIovs = make([]unix.Iovec, len(b.hdrs)*MaxSegments)
		b.ctrl = make([]byte, len(b.hdrs)*segControl)
	}
	for i := 0; i < n; i++ {
		g := &gs[i]
		h := &b.hdrs[i].Hdr
		iovs := b.segIovs[i*MaxSegments : i*MaxSegments+len(g.Segs)]
		for k, s := range g.Segs {
			iovs[k].Base = unsafe.SliceData(s)
			iovs[k].Len = uint64(len(s))
		}
		h.Iov = &iovs[0]
		h.Iovlen = uint64(len(iovs))
		h.Namelen = putAddr(&b.addrs[i], g.Addr)
		h.Control, h.Controllen = nil, 0
		if len(g.Segs) > 1 {
			c := b.ctrl[i*segControl : (i+1)*segControl]
			cm := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			cm.Level, cm.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			cm.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&c[unix.SizeofCmsghdr])) = uint16(len(g.Segs[0]))
			h.Control = &c[0]
			h.SetControllen(segControl)
		}
	}
	r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])),
		uintptr(n), unix.MSG_DONTWAIT, 0, 0)
	// Back to the one-buffer layout of Send and Recv.
	for i := 0; i < n; i++ {
		h := &b.hdrs[i].Hdr
		h.Iov, h.Iovlen, h.Control, h.Controllen = &b.iovs[i], 1, nil, 0
	}
	if errno != 0 {
		if errno == unix.EAGAIN || errno == unix.EINTR || errno == unix.ENOBUFS {
			return 0, nil
		}
		return 0, errno
	}
	return int(r), nil
}

// RecvSegments is Recv on a socket with UDP_GRO on: a message may hold
// several datagrams of one sender, which the kernel did not cut apart,
// and ms[i].Seg is then their size (all but the last have it; the last
// is not longer); 0 for a message of one datagram.
func (b *Batch) RecvSegments(fd int, ms []Message) (int, error) {
	n := min(len(ms), len(b.hdrs))
	if n == 0 {
		return 0, nil
	}
	if b.rctrl == nil {
		b.rctrl = make([]byte, len(b.hdrs)*groControl)
	}
	for i := 0; i < n; i++ {
		h := &b.hdrs[i].Hdr
		h.Control = &b.rctrl[i*groControl]
		h.SetControllen(groControl)
	}
	got, err := b.Recv(fd, ms[:n])
	for i := 0; i < got; i++ {
		ms[i].Seg = 0
		h := &b.hdrs[i].Hdr
		if h.Controllen >= unix.SizeofCmsghdr+4 {
			c := b.rctrl[i*groControl:]
			cm := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			if cm.Level == unix.SOL_UDP && cm.Type == unix.UDP_GRO {
				ms[i].Seg = int(*(*int32)(unsafe.Pointer(&c[unix.SizeofCmsghdr])))
			}
		}
	}
	for i := 0; i < n; i++ {
		b.hdrs[i].Hdr.Control, b.hdrs[i].Hdr.Controllen = nil, 0
	}
	return got, err
}

// groControl is room for the UDP_GRO control message (an int).
const groControl = unix.SizeofCmsghdr + 8
