package main

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"

	"github.com/weft-io/weft/ethernet"
)

// testTable is the forwarding tests' table of 100,000 routes and
// destinations in it, built on first use: the router tests' children
// (nodes, generators, sinks) are this test binary too, and start faster
// without it (seconds each in the emulated VMs).
var testTable = sync.OnceValues(func() (*FIB, [][4]byte) {
	d := make([][4]byte, 1024)
	f, err := GenFIB(100000, 4, d)
	if err != nil {
		panic(err)
	}
	return f, d
})

// frame returns a well-formed UDP/IPv4 frame of size bytes to dst.
func frame(size int, dst [4]byte, ttl uint8) []byte {
	b := make([]byte, size)
	ethernet.PutUDP4(b, &ethernet.UDP4{
		SrcMAC: genMAC(0), DstMAC: inMAC(0),
		SrcIP: netip.AddrFrom4([4]byte{10, 1, 0, 1}), DstIP: netip.AddrFrom4(dst),
		SrcPort: dataPort, DstPort: dataPort, TTL: ttl,
	}, size-ethernet.UDP4HdrLen)
	return b
}

func TestFIB(t *testing.T) {
	testFIB, testDsts := testTable()
	if n := testFIB.Len(); n != 100000 {
		t.Fatalf("FIB has %d routes, want 100000", n)
	}
	owners := map[uint8]int{}
	for _, d := range testDsts {
		r, ok := testFIB.Lookup(d)
		if !ok {
			t.Fatalf("generated destination %v has no route", d)
		}
		owners[r.Owner]++
	}
	if len(owners) != 4 {
		t.Errorf("destinations reach owners %v, want all 4 nodes", owners)
	}
	if _, ok := testFIB.Lookup(unroutable); ok {
		t.Errorf("%v is routable", unroutable)
	}
	// Longest match: a /24 inside a /16 wins.
	var f FIB
	f.Insert(netip.MustParsePrefix("20.1.0.0/16"), Route{Owner: 1})
	f.Insert(netip.MustParsePrefix("20.1.2.0/24"), Route{Owner: 2})
	if r, _ := f.Lookup([4]byte{20, 1, 2, 3}); r.Owner != 2 {
		t.Errorf("20.1.2.3 -> %d, want 2 (the /24)", r.Owner)
	}
	if r, _ := f.Lookup([4]byte{20, 1, 3, 3}); r.Owner != 1 {
		t.Errorf("20.1.3.3 -> %d, want 1 (the /16)", r.Owner)
	}
	// Same table in every process.
	d2 := make([][4]byte, len(testDsts))
	if _, err := GenFIB(100000, 4, d2); err != nil || d2[17] != testDsts[17] {
		t.Errorf("GenFIB is not deterministic")
	}
}

// TestDecTTL checks the incremental update against a full recomputation,
// over random headers, including checksums near 0x0000 and 0xffff.
func TestDecTTL(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200000 {
		ip := make([]byte, 20)
		for j := range ip {
			ip[j] = byte(rng.Uint32())
		}
		ip[0] = 0x45
		ip[8] = byte(2 + rng.IntN(254))
		if i < 512 { // steer toward the edge checksums
			ip[12], ip[13] = byte(i), byte(i>>8)
		}
		binary.BigEndian.PutUint16(ip[10:], 0)
		binary.BigEndian.PutUint16(ip[10:], checksum(ip))
		decTTL(ip)
		if checksum(ip) != 0 {
			t.Fatalf("header %x: checksum wrong after decTTL", ip)
		}
		got := binary.BigEndian.Uint16(ip[10:])
		binary.BigEndian.PutUint16(ip[10:], 0)
		if want := checksum(ip); got != want && !(got == 0xffff && want == 0) && !(got == 0 && want == 0xffff) {
			t.Fatalf("header %x: incremental %04x, full %04x", ip, got, want)
		}
	}
}

func TestForwardFrame(t *testing.T) {
	testFIB, testDsts := testTable()
	good := func() []byte { return frame(64, testDsts[0], 64) }
	want, _ := testFIB.Lookup(testDsts[0])
	cases := []struct {
		name string
		mod  func([]byte) []byte
		want Verdict
	}{
		{"good", func(b []byte) []byte { return b }, Forward},
		{"ttl2", func(b []byte) []byte { return reTTL(b, 2) }, Forward},
		{"ttl1", func(b []byte) []byte { return reTTL(b, 1) }, TTLExpired},
		{"ttl0", func(b []byte) []byte { return reTTL(b, 0) }, TTLExpired},
		{"bad-sum", func(b []byte) []byte { b[24]++; return b }, BadSum},
		{"unroutable", func(b []byte) []byte { copy(b[30:], unroutable[:]); return resum(b) }, Unroutable},
		{"short", func(b []byte) []byte { return b[:33] }, Malformed},
		{"empty", func(b []byte) []byte { return b[:0] }, Malformed},
		{"arp", func(b []byte) []byte { b[12], b[13] = 8, 6; return b }, Malformed},
		{"ipv6-version", func(b []byte) []byte { b[14] = 0x65; return resum(b) }, Malformed},
		{"ihl-4", func(b []byte) []byte { b[14] = 0x44; return b }, Malformed},
		{"ihl-past-frame", func(b []byte) []byte { b[14] = 0x4f; return b[:50] }, Malformed},
		{"total-len-long", func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], 1000); return resum(b) }, Malformed},
		{"total-len-short", func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], 19); return resum(b) }, Malformed},
		// Each bound exactly at its edge is legal.
		{"min-frame", func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], 20); return resum(b[:34]) }, Forward},
		{"total-len-ihl", func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], 20); return resum(b) }, Forward},
		{"total-len-frame", func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], uint16(len(b)-14)); return resum(b) }, Forward},
		{"total-len-past-frame", func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], uint16(len(b)-13)); return resum(b) }, Malformed},
		{"ihl-whole-frame", func(b []byte) []byte { // a 24-byte header with options, nothing after it
			b[14] = 0x46
			binary.BigEndian.PutUint16(b[16:], 24)
			b = b[:38]
			b[24], b[25] = 0, 0
			binary.BigEndian.PutUint16(b[24:], checksum(b[14:38]))
			return b
		}, Forward},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.mod(good())
			before := append([]byte(nil), b...)
			r, v := ForwardFrame(testFIB, b)
			if v != c.want {
				t.Fatalf("verdict %v, want %v", v, c.want)
			}
			if v != Forward {
				if string(b) != string(before) {
					t.Errorf("a dropped frame was changed")
				}
				return
			}
			if r != want {
				t.Errorf("route %+v, want %+v", r, want)
			}
			if ihl := int(b[14]&0x0f) * 4; b[22] != before[22]-1 || checksum(b[14:14+ihl]) != 0 {
				t.Errorf("TTL %d -> %d, checksum ok %v", before[22], b[22], checksum(b[14:14+int(b[14]&0x0f)*4]) == 0)
			}
		})
	}
}

func reTTL(b []byte, ttl byte) []byte { b[22] = ttl; return resum(b) }

func resum(b []byte) []byte {
	b[24], b[25] = 0, 0
	binary.BigEndian.PutUint16(b[24:], checksum(b[14:34]))
	return b
}

// FuzzForwardFrame: no input panics, and a forwarded frame leaves with a
// valid header checksum and its TTL one lower.
func FuzzForwardFrame(f *testing.F) {
	testFIB, testDsts := testTable()
	f.Add(frame(64, testDsts[0], 64))
	f.Add(frame(64, testDsts[1], 1))
	f.Add(frame(1500, unroutable, 9)[:60])
	f.Fuzz(func(t *testing.T, b []byte) {
		ttl := byte(0)
		if len(b) > 22 {
			ttl = b[22]
		}
		_, v := ForwardFrame(testFIB, b)
		if v == Forward {
			ihl := int(b[14]&0xf) * 4
			if checksum(b[14:14+ihl]) != 0 || b[22] != ttl-1 {
				t.Fatalf("forwarded frame %x has a bad checksum or TTL", b)
			}
		}
	})
}

// TestForwardAllocs: the per-packet path allocates nothing.
func TestForwardAllocs(t *testing.T) {
	testFIB, testDsts := testTable()
	b := frame(64, testDsts[3], 64)
	if a := testing.AllocsPerRun(1000, func() { b[22] = 64; resum(b); ForwardFrame(testFIB, b) }); a != 0 {
		t.Errorf("ForwardFrame allocates %v per packet", a)
	}
}
