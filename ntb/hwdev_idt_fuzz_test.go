//go:build linux

package ntb

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
	hwmap "github.com/weft-io/weft/ntb/hw"
	"github.com/weft-io/weft/ntb/internal/chipmodel"
)

// idtFuzzRegs are the registers HWDevice reads from its own function,
// from the peer's (through the global space) and from the switch: each
// fuzz record picks one and the value it reads from then on.
var idtFuzzRegs = func() []func(sw *chipmodel.IDTSwitch, v uint32) {
	var rs []func(sw *chipmodel.IDTSwitch, v uint32)
	local := func(off uint32) func(sw *chipmodel.IDTSwitch, v uint32) {
		return func(sw *chipmodel.IDTSwitch, v uint32) { sw.Port(0).Override(off, v) }
	}
	peer := func(off uint32) func(sw *chipmodel.IDTSwitch, v uint32) {
		return func(sw *chipmodel.IDTSwitch, v uint32) { sw.Port(2).Override(off, v) }
	}
	global := func(a uint32) func(sw *chipmodel.IDTSwitch, v uint32) {
		return func(sw *chipmodel.IDTSwitch, v uint32) { sw.OverrideGlobal(a, v) }
	}
	for b := range uint32(6) {
		rs = append(rs, local(0x470+0x10*b), peer(0x470+0x10*b), peer(0x10+4*b), local(0x10+4*b))
		rs = append(rs, local(0x474+0x10*b), peer(0x478+0x10*b), peer(0x47c+0x10*b))
	}
	for _, off := range []uint32{0x004, 0x04c, 0x400, 0x428, 0x440, 0x460, 0x4d8, 0x4dc} {
		rs = append(rs, local(off), peer(off))
	}
	for _, p := range []int{0, 2, 4} {
		a, _ := hwmap.IDTSwPortSts(p)
		rs = append(rs, global(a))
	}
	for _, p := range []int{0, 1, 2} {
		a, _ := hwmap.IDTSwPartSts(p)
		rs = append(rs, global(a))
	}
	return rs
}()

// idtTyped: every error HWDevice returns is one of the typed ones.
func idtTyped(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, e := range []error{fabric.ErrInvalid, fabric.ErrBounds, fabric.ErrMalformed, fabric.ErrNotSupported, fabric.ErrClosed, ErrMsgBusy} {
		if errors.Is(err, e) {
			return
		}
	}
	t.Errorf("%s: untyped error %v", what, err)
}

// FuzzIDTRegisters: whatever the switch's, the peer's or this function's
// registers read (a 5-byte record: which register, its value), opening
// the NT function and working it give typed errors, never a panic or a
// write outside the memory.
func FuzzIDTRegisters(f *testing.F) {
	rec := func(i byte, v uint32) []byte {
		b := []byte{i, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(b[1:], v)
		return b
	}
	f.Add([]byte{})
	f.Add(rec(0, 0xffffffff))
	f.Add(rec(1, 0x80000004|63<<4))
	f.Add(append(rec(2, 0xfffffff0), rec(5, 0)...))
	f.Add(rec(byte(len(idtFuzzRegs)-1), 0))
	f.Add(rec(byte(len(idtFuzzRegs)-4), 0x3<<6|0x10|7<<10))
	f.Fuzz(fuzzIDTRegisters)
}

func fuzzIDTRegisters(t *testing.T, data []byte) {
	{
		sw := idtModel(t, 0, 2)
		for len(data) >= 5 {
			idtFuzzRegs[int(data[0])%len(idtFuzzRegs)](sw, binary.LittleEndian.Uint32(data[1:5]))
			data = data[5:]
		}
		b, errb := idtOpenPort(t, sw, 2, 0)
		idtTyped(t, "open the peer", errb)
		a, err := idtOpenPort(t, sw, 0, 0)
		idtTyped(t, "open", err)
		if err != nil {
			return
		}
		idtTyped(t, "LinkEnable", a.LinkEnable())
		_ = a.LinkIsUp()
		_ = a.MsgStatus()
		_, err = a.MsgRead(0)
		idtTyped(t, "MsgRead", err)
		idtTyped(t, "PeerMsgWrite", a.PeerMsgWrite(0, 1))
		idtTyped(t, "PeerDBSet", a.PeerDBSet(1))
		_ = a.DBRead()
		for w := range a.MWCount() {
			_, _, sm, err := a.MWGetAlign(w)
			idtTyped(t, "MWGetAlign", err)
			idtTyped(t, "MWSetTrans", a.MWSetTrans(w, 0, min(sm, 4096)))
		}
		for w := range a.PeerMWCount() {
			m, err := a.PeerMW(w)
			idtTyped(t, "PeerMW", err)
			if err == nil && len(m) > 0 {
				m[len(m)-1] = 1 // within the mapping: must not fault
			}
		}
		idtTyped(t, "LinkDisable", a.LinkDisable())
		idtTyped(t, "Close", a.Close())
		if errb == nil {
			idtTyped(t, "Close the peer", b.Close())
		}
	}
}
