package link

import (
	"net/netip"

	"github.com/weft-io/weft/roce/wire"
)

// sealHdr is scratch space for sealing a datagram's ICRC (wire.SealICRC).
type sealHdr [48 + wire.BTHSize]byte

// seal fills in the ICRC of p, which local sends (from its port if
// p.SrcPort is 0), if its sender left it out (Packet.Unsealed), and
// clears the mark: a carrier that is not a ring that takes unsealed
// datagrams never carries one so.
func seal(p *Packet, local netip.AddrPort, h *sealHdr) {
	if !p.Unsealed {
		return
	}
	p.Unsealed = false
	if p.N < wire.BTHSize+wire.ICRCSize || p.N > len(p.Buf) {
		return // malformed: the carrier drops or sends it as it is
	}
	sport := p.SrcPort
	if sport == 0 {
		sport = local.Port()
	}
	wire.SealICRC(h[:], p.Buf[:p.N], local.Addr().Unmap(), p.Addr.Addr().Unmap(), sport)
}
