package vnet

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// msg builds an encapsulated message: header, optional virtio-net header,
// frame of n bytes (an Ethernet frame, or an IPv4 packet for TUN).
func msg(flags uint8, vh []byte, n int) []byte {
	b := make([]byte, HeaderLen+len(vh)+n)
	Header(b).Encode(flags, len(b)-HeaderLen)
	copy(b[HeaderLen:], vh)
	if flags&FlagTUN != 0 && n > 0 {
		b[HeaderLen+len(vh)] = 0x45
	}
	return b
}

func vnetHdr(flags, gso uint8, hdrLen, gsoSize, start, off int) []byte {
	v := make([]byte, VnetHdrLen)
	v[0], v[1] = flags, gso
	binary.LittleEndian.PutUint16(v[2:], uint16(hdrLen))
	binary.LittleEndian.PutUint16(v[4:], uint16(gsoSize))
	binary.LittleEndian.PutUint16(v[6:], uint16(start))
	binary.LittleEndian.PutUint16(v[8:], uint16(off))
	return v
}

func TestParse(t *testing.T) {
	good := vnetHdr(vnetFlagNeedsCsum, gsoTCPv4, 54, 1448, 34, 16)
	badMagic := msg(0, nil, 60)
	badMagic[0] = 'X'
	badVer := msg(0, nil, 60)
	badVer[2] = 2
	badFlags := msg(0x80, nil, 60)
	long := msg(0, nil, 60)
	binary.BigEndian.PutUint32(long[4:], 61) // says more than there is
	short := msg(0, nil, 60)
	binary.BigEndian.PutUint32(short[4:], 59) // says less than there is
	v6 := msg(FlagTUN, nil, 40)
	v6[HeaderLen] = 0x60
	v6runt := msg(FlagTUN, nil, 39)
	v6runt[HeaderLen] = 0x60
	for _, c := range []struct {
		name  string
		msg   []byte
		kind  Kind
		max   int
		want  error
		frame int
	}{
		{"ethernet", msg(0, nil, 60), TAP, 0, nil, 60},
		{"min ethernet", msg(0, nil, 14), TAP, 0, nil, 14},
		{"vnet gso", msg(FlagVnetHdr, good, 9000), TAP, 0, nil, 9000},
		{"ipv4", msg(FlagTUN, nil, 20), TUN, 0, nil, 20},
		{"ipv6", v6, TUN, 0, nil, 40},
		{"max frame", msg(0, nil, 1518), TAP, 1518, nil, 1518},
		{"empty", nil, TAP, 0, ErrTruncated, 0},
		{"header only, bad magic", badMagic[:HeaderLen], TAP, 0, ErrBadHeader, 0},
		{"header only", msg(0, nil, 0), TAP, 0, ErrTruncated, 0},
		{"runt ipv4", msg(FlagTUN, nil, 19), TUN, 0, ErrTruncated, 0},
		{"runt ipv6", v6runt, TUN, 0, ErrTruncated, 0},
		{"header only part", msg(0, nil, 60)[:5], TAP, 0, ErrTruncated, 0},
		{"runt ethernet", msg(0, nil, 13), TAP, 0, ErrTruncated, 0},
		{"bad magic", badMagic, TAP, 0, ErrBadHeader, 0},
		{"bad version", badVer, TAP, 0, ErrBadHeader, 0},
		{"unknown flag", badFlags, TAP, 0, ErrBadHeader, 0},
		{"truncated", long, TAP, 0, ErrTruncated, 0},
		{"padded", short, TAP, 0, ErrBadHeader, 0},
		{"oversized", msg(0, nil, 1519), TAP, 1518, ErrOversized, 0},
		{"oversized absolute", msg(0, nil, MaxFrame+1), TAP, 0, ErrOversized, 0},
		{"tun frame on tap", msg(FlagTUN, nil, 60), TAP, 0, ErrBadFrame, 0},
		{"tap frame on tun", msg(0, nil, 60), TUN, 0, ErrBadFrame, 0},
		{"not ip", msg(FlagTUN, nil, 20)[:0:0], TUN, 0, ErrTruncated, 0},
		{"vnet short", msg(FlagVnetHdr, nil, 5), TAP, 0, ErrTruncated, 0},
		{"vnet csum outside", msg(FlagVnetHdr, vnetHdr(vnetFlagNeedsCsum, 0, 0, 0, 59, 0), 60), TAP, 0, ErrBadVnetHdr, 0},
		{"vnet unknown gso", msg(FlagVnetHdr, vnetHdr(vnetFlagNeedsCsum, 9, 0, 100, 34, 16), 60), TAP, 0, ErrBadVnetHdr, 0},
		{"vnet gso without csum", msg(FlagVnetHdr, vnetHdr(0, gsoTCPv4, 54, 1448, 0, 0), 60), TAP, 0, ErrBadVnetHdr, 0},
		{"vnet gso size 0", msg(FlagVnetHdr, vnetHdr(vnetFlagNeedsCsum, gsoTCPv4, 54, 0, 34, 16), 60), TAP, 0, ErrBadVnetHdr, 0},
		{"vnet unknown flag", msg(FlagVnetHdr, vnetHdr(0x40, 0, 0, 0, 0, 0), 60), TAP, 0, ErrBadVnetHdr, 0},
		{"vnet hdr_len outside", msg(FlagVnetHdr, vnetHdr(0, 0, 61, 0, 0, 0), 60), TAP, 0, ErrBadVnetHdr, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "not ip" {
				c.msg = msg(FlagTUN, nil, 20)
				c.msg[HeaderLen] = 0x15
				c.want = ErrBadFrame
			}
			_, _, frame, err := Parse(c.msg, c.kind, c.max)
			if c.want == nil {
				if err != nil || len(frame) != c.frame {
					t.Fatalf("Parse: frame %d bytes, %v; want %d bytes", len(frame), err, c.frame)
				}
				if !Header(c.msg).IsValid(len(c.msg)) {
					t.Fatal("IsValid false for a valid header")
				}
				return
			}
			if !errors.Is(err, c.want) || !errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("Parse: %v, want %v wrapping fabric.ErrMalformed", err, c.want)
			}
		})
	}
}

func TestParseAllocs(t *testing.T) {
	m := msg(FlagVnetHdr, vnetHdr(vnetFlagNeedsCsum, gsoTCPv4, 54, 1448, 34, 16), 9000)
	bad := msg(0, nil, 3)
	if n := testing.AllocsPerRun(1000, func() {
		Parse(m, TAP, 0)
		Parse(bad, TAP, 0)
	}); n != 0 {
		t.Fatalf("Parse allocates %.1f times per call", n)
	}
}

// FuzzParse: whatever a peer sends, Parse never panics, and what it
// accepts is consistent: the frame lies inside the message, fits the
// limit, and its virtio-net header is one the kernel may be given.
func FuzzParse(f *testing.F) {
	f.Add(msg(0, nil, 60), false, 1518)
	f.Add(msg(FlagVnetHdr, vnetHdr(vnetFlagNeedsCsum, gsoTCPv4, 54, 1448, 34, 16), 200), false, 0)
	f.Add(msg(FlagTUN, nil, 20), true, 1500)
	f.Add([]byte("WV\x01\x00\x00\x00\x00\x01"), false, 0)
	f.Fuzz(func(t *testing.T, b []byte, tun bool, max int) {
		kind := TAP
		if tun {
			kind = TUN
		}
		flags, vh, frame, err := Parse(b, kind, max)
		if err != nil {
			if !errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if !Header(b).IsValid(len(b)) {
			t.Fatal("accepted a message whose header is not valid")
		}
		lim := max
		if lim <= 0 || lim > MaxFrame {
			lim = MaxFrame
		}
		if len(frame) > lim || len(frame) < 14 && kind == TAP || len(frame) < 20 && kind == TUN {
			t.Fatalf("accepted a %d-byte frame (limit %d)", len(frame), lim)
		}
		if HeaderLen+len(vh)+len(frame) != len(b) {
			t.Fatal("frame does not account for the message")
		}
		if (vh != nil) != (flags&FlagVnetHdr != 0) || vh != nil && !vh.IsValid(len(frame)) {
			t.Fatal("accepted a bad virtio-net header")
		}
	})
}
