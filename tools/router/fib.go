package main

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/gaissmai/bart"
)

// The FIB is a longest-prefix-match table of IPv4 prefixes. It is built
// with github.com/gaissmai/bart (balanced routing tables): a multibit trie
// with popcount-compressed nodes in the style of Knuth's ART. It was picked
// over the alternatives because it is maintained, has no dependencies,
// keeps a full BGP table in a few megabytes, answers Lookup in tens of
// nanoseconds without allocating (BenchmarkForward proves the last point
// in the router), and is safe for concurrent readers. A hand-written
// DIR-24-8 would be faster still but takes 32 MiB per node and is code
// the router does not need to carry.

// Route is what a FIB entry holds: the node that owns the egress port for
// the prefix (RouteBricks' output node). Each node has one egress link, so
// the owner also names the next hop (the sink's address on that link).
type Route struct {
	Owner uint8
}

// FIB is a node's forwarding table.
type FIB struct {
	t      bart.Table[Route]
	routes int
}

// Lookup returns the route for dst, or false if no prefix covers it.
func (f *FIB) Lookup(dst [4]byte) (Route, bool) {
	return f.t.Lookup(netip.AddrFrom4(dst))
}

// Len returns the number of prefixes.
func (f *FIB) Len() int { return f.routes }

// Insert adds a prefix.
func (f *FIB) Insert(p netip.Prefix, r Route) {
	if _, ok := f.t.Get(p); !ok {
		f.routes++
	}
	f.t.Insert(p, r)
}

// fibSeed makes every process of a run build the same table.
const fibSeed = 0x5eed_0011

// GenFIB builds a table of n distinct IPv4 prefixes spread over the
// unicast space (never 10/8, where the router's links live, nor 127/8
// or 224/3), with the prefix-length mix of a public BGP table (about 60%
// /24, the rest /8 to /23, more of the longer ones), each owned by node
// prefix-hash mod nodes. dsts receives up to len(dsts) host addresses
// inside the table's prefixes, one per prefix drawn at random, for the
// generator. Every process calling it with the same n and nodes gets the
// same table.
func GenFIB(n, nodes int, dsts [][4]byte) (*FIB, error) {
	if nodes < 1 || nodes > 255 {
		return nil, fmt.Errorf("fib: %d nodes", nodes)
	}
	rng := rand.New(rand.NewPCG(fibSeed, uint64(n)))
	f := &FIB{}
	pfxs := make([]netip.Prefix, 0, n)
	for len(pfxs) < n {
		var bits int
		switch x := rng.IntN(100); {
		case x < 60:
			bits = 24
		case x < 75:
			bits = 23 - rng.IntN(2)
		case x < 95:
			bits = 21 - rng.IntN(5)
		default:
			bits = 16 - rng.IntN(9)
		}
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], rng.Uint32())
		if a[0] == 0 || a[0] == 10 || a[0] == 127 || a[0] >= 224 {
			continue
		}
		p := netip.PrefixFrom(netip.AddrFrom4(a), bits).Masked()
		if _, ok := f.t.Get(p); ok {
			continue
		}
		f.Insert(p, Route{Owner: uint8(hashPrefix(p) % uint32(nodes))})
		pfxs = append(pfxs, p)
	}
	for i := range dsts {
		p := pfxs[rng.IntN(len(pfxs))]
		a := p.Addr().As4()
		host := rng.Uint32() & (1<<(32-p.Bits()) - 1)
		v := binary.BigEndian.Uint32(a[:]) | host
		binary.BigEndian.PutUint32(dsts[i][:], v)
	}
	return f, nil
}

// hashPrefix spreads prefixes over the nodes (FNV-1a of address and
// length), so that ownership does not depend on the order of insertion.
func hashPrefix(p netip.Prefix) uint32 {
	h := uint32(2166136261)
	a := p.Addr().As4()
	for _, b := range append(a[:], byte(p.Bits())) {
		h ^= uint32(b)
		h *= 16777619
	}
	return h
}

// unroutable is an address no generated prefix covers (240/4 is never
// generated).
var unroutable = [4]byte{240, 0, 0, 1}
