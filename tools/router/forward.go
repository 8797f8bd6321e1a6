package main

import (
	"encoding/binary"
)

// Verdict is what the forwarding step decides for one frame.
type Verdict uint8

// Verdicts. Every value but Forward is a drop, counted under its name.
const (
	Forward    Verdict = iota // forward to Route.Owner
	Malformed                 // not a well-formed Ethernet/IPv4 frame
	BadSum                    // IPv4 header checksum wrong
	TTLExpired                // TTL 0 or 1: forwarding would make it 0
	Unroutable                // no prefix covers the destination
	NumVerdicts
)

var verdictNames = [NumVerdicts]string{"forwarded", "malformed", "bad-checksum", "ttl-expired", "unroutable"}

// String returns the verdict's counter name.
func (v Verdict) String() string { return verdictNames[v] }

// Counters counts verdicts.
type Counters [NumVerdicts]uint64

// ForwardFrame is the per-packet work of a router: it validates the
// Ethernet/IPv4 frame f (EtherType, version, header length, total length,
// header checksum), drops what is malformed, has TTL 0 or 1 or no route,
// and otherwise decrements the TTL, updates the header checksum
// incrementally (RFC 1624) and returns the route. It changes f only when
// the verdict is Forward. It does not allocate.
func ForwardFrame(fib *FIB, f []byte) (Route, Verdict) {
	const eth = 14
	if len(f) < eth+20 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
		return Route{}, Malformed
	}
	ip := f[eth:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || ihl > len(ip) {
		return Route{}, Malformed
	}
	if tot := int(binary.BigEndian.Uint16(ip[2:4])); tot < ihl || tot > len(ip) {
		return Route{}, Malformed
	}
	if checksum(ip[:ihl]) != 0 {
		return Route{}, BadSum
	}
	if ip[8] <= 1 {
		return Route{}, TTLExpired
	}
	r, ok := fib.Lookup([4]byte(ip[16:20]))
	if !ok {
		return Route{}, Unroutable
	}
	decTTL(ip)
	return r, Forward
}

// decTTL decrements the TTL of the IPv4 header ip and updates its checksum
// by RFC 1624 equation 3, HC' = ~(~HC + ~m + m'), where m is the 16-bit
// word holding TTL and protocol: one's-complement arithmetic that never
// produces the -0 that RFC 1141's form could.
func decTTL(ip []byte) {
	m := uint32(binary.BigEndian.Uint16(ip[8:10]))
	ip[8]--
	m2 := uint32(binary.BigEndian.Uint16(ip[8:10]))
	hc := uint32(binary.BigEndian.Uint16(ip[10:12]))
	s := (^hc & 0xffff) + (^m & 0xffff) + m2
	s = (s & 0xffff) + s>>16
	s = (s & 0xffff) + s>>16
	binary.BigEndian.PutUint16(ip[10:12], ^uint16(s))
}

// checksum returns the Internet checksum of b (RFC 1071): 0 over a header
// whose checksum field is right.
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = (s & 0xffff) + s>>16
	}
	return ^uint16(s)
}
