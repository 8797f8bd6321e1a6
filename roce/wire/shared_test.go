package wire

import (
	"bytes"
	"testing"
)

// MaxHeaderLen holds the headers of every opcode.
func TestMaxHeaderLen(t *testing.T) {
	most := 0
	for op := range 256 {
		most = max(most, OpCode(op).HeaderLen())
	}
	if most != MaxHeaderLen {
		t.Fatalf("the longest headers are %d bytes, MaxHeaderLen %d", most, MaxHeaderLen)
	}
}

// ParseShared reads the headers once, from its copy: a change to the
// datagram after the parse changes no header of the Packet, nor the
// payload's bounds; the result is Parse's otherwise.
func TestParseShared(t *testing.T) {
	f := Fields{BTH: BTHFields{OpCode: OpRCWriteOnlyWithImmediate, PKey: DefaultPKey, DestQP: 0x42, PSN: 9},
		RETH: RETHFields{VA: 0x1000, RKey: 7, DMALength: 5}, Imm: 0xabcd}
	b := make([]byte, PacketLen(f.BTH.OpCode, 5))
	n, err := Build(b, &f, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b = b[:n]
	want, err := Parse(bytes.Clone(b))
	if err != nil {
		t.Fatal(err)
	}
	var hdr [MaxHeaderLen]byte
	p, err := ParseShared(b, &hdr)
	if err != nil {
		t.Fatal(err)
	}
	clear(b[:len(b)-ICRCSize-8]) // the headers, by a writer of shared memory
	b[0] = byte(OpRCReadRequest)
	if p.OpCode() != want.OpCode() || p.BTH.PSN() != 9 || p.RETH.VA() != 0x1000 || p.RETH.DMALength() != 5 ||
		p.ImmDt.Imm() != 0xabcd || len(p.Payload) != 5 || p.ICRC != want.ICRC {
		t.Fatalf("after a change to the datagram: %v PSN %d VA %#x len %d imm %#x payload %d; want them as parsed",
			p.OpCode(), p.BTH.PSN(), p.RETH.VA(), p.RETH.DMALength(), p.ImmDt.Imm(), len(p.Payload))
	}
	for _, short := range [][]byte{b[:BTHSize+ICRCSize-4], nil} {
		if _, err := ParseShared(short, &hdr); err == nil {
			t.Fatalf("ParseShared of %d bytes: no error", len(short))
		}
	}
}
