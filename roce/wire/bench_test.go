package wire

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"testing"
)

// benchPacket returns an IPv4 RoCEv2 RDMA_WRITE_ONLY packet with a payload
// of n bytes, ICRC set.
func benchPacket(tb testing.TB, n int) []byte {
	const ip = ipv4MinHeader
	udpLen := udpHeader + PacketLen(OpRCWriteOnly, n)
	pkt := make([]byte, ip+udpLen)
	pkt[0] = 0x45
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	pkt[8] = 64
	pkt[9] = 17
	copy(pkt[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	binary.BigEndian.PutUint16(pkt[ip:], UDPSrcPort(0, 17, 18))
	binary.BigEndian.PutUint16(pkt[ip+2:], UDPPort)
	binary.BigEndian.PutUint16(pkt[ip+4:], uint16(udpLen))
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i)
	}
	f := Fields{
		BTH:  BTHFields{OpCode: OpRCWriteOnly, PKey: DefaultPKey, DestQP: 18, AckReq: true, PSN: 1},
		RETH: RETHFields{VA: 0x7f0000001000, RKey: 0x1234, DMALength: uint32(n)},
	}
	if _, err := Build(pkt[ip+udpHeader:], &f, payload); err != nil {
		tb.Fatal(err)
	}
	if err := PutICRC(pkt); err != nil {
		tb.Fatal(err)
	}
	return pkt
}

func BenchmarkParse(b *testing.B) {
	for _, n := range []int{0, 64, 4096} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			udp := benchPacket(b, n)[ipv4MinHeader+udpHeader:]
			b.ReportAllocs()
			b.SetBytes(int64(len(udp)))
			var sink int
			for b.Loop() {
				p, err := Parse(udp)
				if err != nil {
					b.Fatal(err)
				}
				sink += len(p.Payload)
			}
			_ = sink
		})
	}
}

func BenchmarkParseCNP(b *testing.B) {
	udp := unhex(b, vectors[0].frame)[ethHeader+ipv4MinHeader+udpHeader:]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(udp); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseMalformed(b *testing.B) {
	udp := benchPacket(b, 64)[ipv4MinHeader+udpHeader:]
	udp = udp[:len(udp)-1]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(udp); err == nil {
			b.Fatal("parsed")
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	buf := make([]byte, 2048)
	payload := make([]byte, 1024)
	f := Fields{BTH: BTHFields{OpCode: OpRCWriteOnlyWithImmediate, PKey: DefaultPKey}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := BuildHeaders(buf, &f, len(payload)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkICRC measures the ICRC over whole packets: the masked headers
// and the payload. SetBytes is the length hashed (the IP packet).
func BenchmarkICRC(b *testing.B) {
	for _, n := range []int{0, 64, 256, 1024, 4096, 9000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			pkt := benchPacket(b, n)
			b.ReportAllocs()
			b.SetBytes(int64(len(pkt)))
			var sink uint32
			for b.Loop() {
				c, err := ICRC(pkt)
				if err != nil {
					b.Fatal(err)
				}
				sink += c
			}
			_ = sink
		})
	}
}

func BenchmarkVerifyICRC(b *testing.B) {
	pkt := benchPacket(b, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if err := VerifyICRC(pkt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCRC32 is the baseline: hash/crc32 over the same number of bytes,
// without masking.
func BenchmarkCRC32(b *testing.B) {
	for _, n := range []int{0, 4096} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			pkt := benchPacket(b, n)
			b.ReportAllocs()
			b.SetBytes(int64(len(pkt)))
			var sink uint32
			for b.Loop() {
				sink += crc32.ChecksumIEEE(pkt)
			}
			_ = sink
		})
	}
}
