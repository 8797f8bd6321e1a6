package wire

import (
	"errors"
	"net/netip"
)

// GID is a 128-bit global identifier. A RoCEv2 GID is the IP address of a
// port: an IPv6 address, or an IPv4 address in IPv4-mapped form
// (::ffff:a.b.c.d), which selects IPv4 encapsulation.
type GID [16]byte

// GIDFromAddr returns the GID of an IP address. An IPv4 address becomes
// its IPv4-mapped form; the zone of an IPv6 address is dropped. The zero
// Addr yields the zero GID.
func GIDFromAddr(a netip.Addr) GID {
	if !a.IsValid() {
		return GID{}
	}
	return GID(a.As16())
}

// ParseGID parses a GID written as an IP address: an IPv4 address, an
// IPv6 address in any form netip accepts (including the eight groups of
// four digits that sysfs and ibv_devinfo print) or an IPv4-mapped one.
func ParseGID(s string) (GID, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return GID{}, err
	}
	if a.Zone() != "" {
		return GID{}, errors.New("wire: GID " + s + " has a zone")
	}
	return GIDFromAddr(a), nil
}

// Addr returns the GID as an IP address: an IPv4 address if the GID is
// IPv4-mapped, otherwise an IPv6 address.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// IsIPv4Mapped reports whether the GID is an IPv4-mapped address, that is
// whether RoCEv2 carries packets to it over IPv4.
func (g GID) IsIPv4Mapped() bool { return netip.AddrFrom16(g).Is4In6() }

// IsZero reports whether the GID is all zeros (an unused GID table entry).
func (g GID) IsZero() bool { return g == GID{} }

// String returns the GID in the usual IPv6 text form; an IPv4-mapped GID is
// written ::ffff:a.b.c.d.
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// MarshalText implements encoding.TextMarshaler with the String form.
func (g GID) MarshalText() ([]byte, error) { return []byte(g.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseGID.
func (g *GID) UnmarshalText(b []byte) error {
	v, err := ParseGID(string(b))
	if err != nil {
		return err
	}
	*g = v
	return nil
}
