package wire_test

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/wire"
)

// Build an RDMA WRITE with immediate data into a buffer, wrap it in IPv4
// and UDP, set the ICRC and parse it back.
func Example() {
	src := wire.GIDFromAddr(netip.MustParseAddr("10.0.0.1"))
	dst := wire.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))
	const localQP, remoteQP = 0x11, 0x22
	payload := []byte("hello, RDMA")

	// IPv4 (20 bytes) | UDP (8) | RoCEv2 UDP payload
	udpLen := 8 + wire.PacketLen(wire.OpRCWriteOnlyWithImmediate, len(payload))
	pkt := make([]byte, 20+udpLen)
	pkt[0], pkt[8], pkt[9] = 0x45, 64, 17 // version/IHL, TTL, protocol UDP
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(pkt[12:], s[:])
	copy(pkt[16:], d[:])
	binary.BigEndian.PutUint16(pkt[20:], wire.UDPSrcPort(0, localQP, remoteQP))
	binary.BigEndian.PutUint16(pkt[22:], wire.UDPPort)
	binary.BigEndian.PutUint16(pkt[24:], uint16(udpLen))

	f := wire.Fields{
		BTH:  wire.BTHFields{OpCode: wire.OpRCWriteOnlyWithImmediate, PKey: wire.DefaultPKey, DestQP: remoteQP, AckReq: true, PSN: 100},
		RETH: wire.RETHFields{VA: 0x7f0000001000, RKey: 0xabc, DMALength: uint32(len(payload))},
		Imm:  42,
	}
	if _, err := wire.Build(pkt[28:], &f, payload); err != nil {
		panic(err)
	}
	// The IP and UDP checksums may be filled in before or after: the ICRC
	// does not cover them.
	if err := wire.PutICRC(pkt); err != nil {
		panic(err)
	}

	// Receive side: b is what follows the Ethernet header of a frame,
	// possibly with padding.
	b := append(pkt, make([]byte, 6)...)
	ip, udp, err := wire.SplitIP(b)
	if err != nil {
		panic(err)
	}
	if err := wire.VerifyICRC(ip); err != nil {
		panic(err)
	}
	p, err := wire.Parse(udp)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.OpCode(), "to QP", p.BTH.DestQP(), "PSN", p.BTH.PSN(), "pad", p.BTH.PadCount())
	fmt.Printf("VA %#x R_Key %#x len %d imm %d\n", p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALength(), p.ImmDt.Imm())
	fmt.Printf("%q\n", p.Payload)
	// Output:
	// RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE to QP 34 PSN 100 pad 1
	// VA 0x7f0000001000 R_Key 0xabc len 11 imm 42
	// "hello, RDMA"
}

// Verify the ICRC of a CNP captured from a ConnectX-4 Lx (from scapy's
// RoCE tests) and read its headers.
func ExampleVerifyICRC() {
	ip, _ := hex.DecodeString("45c2003c718c400040119161" + "0a0011010a001201" + // IPv4
		"000012b700280000" + // UDP
		"8100ffff40000118" + "00000000" + // BTH
		"00000000000000000000000000000000" + // reserved
		"82fd002a") // ICRC
	fmt.Println(wire.VerifyICRC(ip))
	p, _ := wire.Parse(ip[28:])
	fmt.Println(p.OpCode(), "QP", p.BTH.DestQP(), "BECN", p.BTH.BECN())

	ip[30]++ // change the BTH P_Key
	err := wire.VerifyICRC(ip)
	fmt.Println(err, errors.Is(err, fabric.ErrMalformed))
	// Output:
	// <nil>
	// CNP QP 280 BECN true
	// malformed roce/wire packet: ICRC mismatch true
}

// Decode the syndrome of an AETH.
func ExampleSyndrome() {
	for _, s := range []wire.Syndrome{0x1f, 0x2e, 0x60, 0x62} {
		fmt.Println(s.Type(), s)
	}
	// Output:
	// ACK ACK(credits=31)
	// RNR_NAK RNR_NAK(1.28ms)
	// NAK NAK(PSN_SEQUENCE_ERROR)
	// NAK NAK(REMOTE_ACCESS_ERROR)
}

// PSNs compare modulo 2^24.
func ExamplePSN() {
	last := wire.PSN(wire.PSNMask)
	next := last.Next()
	fmt.Println(next, next.Sub(last), last.Less(next))
	// Output: 0 1 true
}
