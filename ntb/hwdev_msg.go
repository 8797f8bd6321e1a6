//go:build linux

package ntb

import (
	"fmt"

	"github.com/weft-io/weft/fabric"
)

// Message registers (Messenger), for maps whose Ops.Msg locates them,
// with their status kept one of two ways (hw.MsgOps): per register, the
// sender checking the peer's register is empty before it writes
// (Switchtec, through the peer's MSG_MAP), or in one status register
// with the sender's failure bit read after the write (IDT). Either way a
// message never overwrites one the peer has not cleared, and is refused
// with ErrMsgBusy.

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

// msgBits is the mask of Count status bits.
func (d *HWDevice) msgBits() uint64 { return 1<<uint(d.o.Msg.Count) - 1 }

// maskMessages masks every message interrupt of a one-register status
// (the driver polls), as it masks the doorbells.
func (d *HWDevice) maskMessages() error {
	m := d.o.Msg
	if m == nil || m.Mask == "" {
		return nil
	}
	r, err := d.reg(m.Mask, 0, 0)
	if err != nil {
		return err
	}
	d.store(r, d.msgBits()<<m.InShift|d.msgBits()<<m.OutShift)
	return nil
}

// MsgStatus implements Messenger: a bit per inbound register whose
// status says it holds a message. A one-register status of all ones (an
// absent device) reads as none.
func (d *HWDevice) MsgStatus() uint64 {
	if d.o.Msg == nil || d.closed.Load() {
		return 0
	}
	if m := d.o.Msg; m.Status != "" {
		r, err := d.reg(m.Status, 0, regDB)
		if err != nil {
			return 0
		}
		v := d.load(r)
		if v == widthMax(r.width) {
			return 0
		}
		return v >> m.InShift & d.msgBits()
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

// MsgClear implements Messenger: ones written to a one-register status's
// inbound bits, or the full bit to each register's status, clear them.
func (d *HWDevice) MsgClear(bits uint64) error {
	if err := d.msgCheck(0); err != nil {
		return err
	}
	if bits>>d.o.Msg.Count != 0 {
		return fmt.Errorf("ntb: hardware %s: message bits %#x beyond %d registers: %w", d.name, bits, d.o.Msg.Count, fabric.ErrInvalid)
	}
	if d.o.Msg.Status != "" {
		r, err := d.reg(d.o.Msg.Status, 0, regDB)
		if err != nil {
			return err
		}
		d.store(r, bits<<d.o.Msg.InShift)
		return nil
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
	if d.o.Msg.Status != "" {
		return d.msgSendChecked(r, idx, v)
	}
	if d.sw == nil || d.o.Msg.Route == "" {
		return d.noMsg()
	}
	// The check and the write are one step for this side's senders:
	// two of them that both saw the register empty would overwrite.
	d.msgMu.Lock()
	defer d.msgMu.Unlock()
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

// msgSendChecked sends through a one-register status (IDT): the
// outbound register's failure bit is cleared, the message routed to the
// peer's inbound register idx (IDT: the partition's SWPxMSGCTL, through
// the global registers) and written; then the failure bit is read: set,
// the peer still held its last message in that register, nothing was
// delivered. (The read follows the write on the same function, so PCIe
// ordering has the write done first.)
func (d *HWDevice) msgSendChecked(out regLoc, idx int, v uint32) error {
	st, err := d.reg(d.o.Msg.Status, 0, regDB)
	if err != nil {
		return err
	}
	fail := uint64(1) << (d.o.Msg.OutShift + uint(idx))
	d.msgMu.Lock()
	defer d.msgMu.Unlock()
	d.store(st, fail)
	if err := d.idtRoute(idx); err != nil {
		return err
	}
	d.store(out, uint64(v))
	got := d.load(st)
	if got == widthMax(st.width) {
		return fmt.Errorf("ntb: hardware %s: message status reads all ones (device absent?): %w", d.name, fabric.ErrMalformed)
	}
	if got&fail != 0 {
		d.store(st, fail)
		return fmt.Errorf("ntb: hardware %s: message register %d: %w", d.name, idx, ErrMsgBusy)
	}
	return nil
}
