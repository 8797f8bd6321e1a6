//go:build linux

package ntb

import (
	"fmt"

	"github.com/weft-io/weft/fabric"
)

// Message registers (Messenger), for maps whose Ops.Msg locates them.
// The inbound registers and their status are in this side's doorbell
// block; a message is sent through this side's outbound register once
// the register it reaches on the peer is known to be empty (Switchtec:
// found through the peer's MSG_MAP), so it never overwrites a message
// the peer has not cleared.

var _ Messenger = (*HWDevice)(nil)

func (d *HWDevice) noMsg() error {
	return fmt.Errorf("ntb: hardware %s: %s bridges have no message registers this driver works: %w", d.name, d.m.Family, fabric.ErrNotSupported)
}

// MsgCount implements Messenger: the map's message registers each way
// (0: none).
func (d *HWDevice) MsgCount() int {
	if d.o.Msg == nil {
		return 0
	}
	return d.o.Msg.Count
}

func (d *HWDevice) msgCheck(idx int) error {
	if d.o.Msg == nil {
		return d.noMsg()
	}
	if d.closed.Load() {
		return d.errClosed()
	}
	if idx < 0 || idx >= d.o.Msg.Count {
		return fmt.Errorf("ntb: hardware %s: message register %d of %d: %w", d.name, idx, d.o.Msg.Count, fabric.ErrInvalid)
	}
	return nil
}

// MsgStatus implements Messenger: a bit per inbound register whose
// status says it holds a message.
func (d *HWDevice) MsgStatus() uint64 {
	if d.o.Msg == nil || d.closed.Load() {
		return 0
	}
	var v uint64
	for i := range d.o.Msg.Count {
		r, err := d.reg(d.o.Msg.InStatus, i, regDB)
		if err != nil {
			return 0
		}
		if d.load(r)&d.o.Msg.Full != 0 {
			v |= 1 << i
		}
	}
	return v
}

// MsgClear implements Messenger: the full bit is written to each
// register's status, which clears it.
func (d *HWDevice) MsgClear(bits uint64) error {
	if err := d.msgCheck(0); err != nil {
		return err
	}
	if bits>>d.o.Msg.Count != 0 {
		return fmt.Errorf("ntb: hardware %s: message bits %#x beyond %d registers: %w", d.name, bits, d.o.Msg.Count, fabric.ErrInvalid)
	}
	var rs []regLoc
	for i := range d.o.Msg.Count {
		if bits&(1<<i) == 0 {
			continue
		}
		r, err := d.reg(d.o.Msg.InStatus, i, regDB)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	for _, r := range rs {
		d.store(r, d.o.Msg.Full)
	}
	return nil
}

// MsgRead implements Messenger.
func (d *HWDevice) MsgRead(idx int) (uint32, error) {
	if err := d.msgCheck(idx); err != nil {
		return 0, err
	}
	r, err := d.reg(d.o.Msg.In, idx, regDB)
	if err != nil {
		return 0, err
	}
	return uint32(d.load(r)), nil
}

// PeerMsgWrite implements Messenger: ErrMsgBusy while the peer's
// register still holds the last message.
func (d *HWDevice) PeerMsgWrite(idx int, v uint32) error {
	if err := d.msgCheck(idx); err != nil {
		return err
	}
	r, err := d.reg(d.o.Msg.Out, idx, regDB)
	if err != nil {
		return err
	}
	if d.sw == nil || d.o.Msg.Route == "" {
		return d.noMsg()
	}
	full, err := d.swPeerMsgFull(idx)
	if err != nil {
		return err
	}
	if full {
		return fmt.Errorf("ntb: hardware %s: message register %d: %w", d.name, idx, ErrMsgBusy)
	}
	d.store(r, uint64(v))
	return nil
}
