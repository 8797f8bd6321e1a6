package netns

import (
	"errors"
	"fmt"
	"net"
)

// PairConfig describes two namespaces joined by a veth pair, the usual
// test topology: A (name "veth0", 10.11.0.1/24) <-> B ("veth1",
// 10.11.0.2/24). The zero value selects those defaults.
type PairConfig struct {
	// NameA and NameB name the veth ends (defaults "veth0", "veth1").
	NameA, NameB string
	// AddrA and AddrB are CIDR addresses (defaults 10.11.0.1/24 and
	// 10.11.0.2/24; "-" for none).
	AddrA, AddrB string
	// MACA and MACB are the ends' MAC addresses (defaults
	// 02:00:00:00:00:01 and 02:00:00:00:00:02).
	MACA, MACB net.HardwareAddr
	// MTU of both ends (0: 1500).
	MTU int
	// Queues per end (0: 1).
	Queues int
	// StaticNeigh adds permanent neighbour entries both ways, so no ARP
	// is needed between the two addresses.
	StaticNeigh bool
	// NameNS, if set, makes both namespaces named: NameNS+"-a" and
	// NameNS+"-b" under /run/netns, so another process can enter them.
	NameNS string
}

// Pair is two namespaces joined by a veth pair whose ends are up.
type Pair struct {
	A, B         *NS
	NameA, NameB string
	MACA, MACB   net.HardwareAddr
	IPA, IPB     net.IP
}

// NewPair creates the topology of c. Close removes it.
func NewPair(c PairConfig) (*Pair, error) {
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&c.NameA, "veth0")
	def(&c.NameB, "veth1")
	def(&c.AddrA, "10.11.0.1/24")
	def(&c.AddrB, "10.11.0.2/24")
	if c.MACA == nil {
		c.MACA = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	}
	if c.MACB == nil {
		c.MACB = net.HardwareAddr{2, 0, 0, 0, 0, 2}
	}
	p := &Pair{NameA: c.NameA, NameB: c.NameB, MACA: c.MACA, MACB: c.MACB}
	var err error
	mk := func(suffix string) (*NS, error) {
		if c.NameNS != "" {
			return NewNamed(c.NameNS + suffix)
		}
		return New()
	}
	if p.A, err = mk("-a"); err != nil {
		return nil, err
	}
	if p.B, err = mk("-b"); err != nil {
		p.A.Close()
		return nil, err
	}
	fail := func(err error) (*Pair, error) {
		p.Close()
		return nil, fmt.Errorf("netns: pair: %w", err)
	}
	if err := p.A.AddVeth(VethConfig{Name: c.NameA, Peer: c.NameB, PeerNS: p.B, MTU: c.MTU,
		Addr: c.MACA, PeerAddr: c.MACB, Queues: c.Queues}); err != nil {
		return fail(err)
	}
	for _, s := range []struct {
		ns         *NS
		name, addr string
		ip         *net.IP
	}{{p.A, c.NameA, c.AddrA, &p.IPA}, {p.B, c.NameB, c.AddrB, &p.IPB}} {
		// No IPv6: router solicitations and DAD would put stray frames on
		// the wire during measurements.
		if err := s.ns.Sysctl("net/ipv6/conf/all/disable_ipv6", "1"); err != nil {
			return fail(err)
		}
		if err := s.ns.Up("lo"); err != nil {
			return fail(err)
		}
		if s.addr != "-" {
			if err := s.ns.AddAddr(s.name, s.addr); err != nil {
				return fail(err)
			}
			ip, _, _ := net.ParseCIDR(s.addr)
			*s.ip = ip.To4()
		}
		if err := s.ns.Up(s.name); err != nil {
			return fail(err)
		}
	}
	if c.StaticNeigh && p.IPA != nil && p.IPB != nil {
		if err := p.A.AddNeigh(c.NameA, p.IPB, c.MACB); err != nil {
			return fail(err)
		}
		if err := p.B.AddNeigh(c.NameB, p.IPA, c.MACA); err != nil {
			return fail(err)
		}
	}
	return p, nil
}

// Close closes both namespaces; the veth pair goes with them.
func (p *Pair) Close() error {
	var errs []error
	if p.A != nil {
		errs = append(errs, p.A.Close())
	}
	if p.B != nil {
		errs = append(errs, p.B.Close())
	}
	return errors.Join(errs...)
}
