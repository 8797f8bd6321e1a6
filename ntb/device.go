package ntb

import (
	"context"
	"errors"
)

// Device is one side of a non-transparent bridge, modelled on the Linux NTB
// client API (include/linux/ntb.h) for a two-port bridge: memory windows
// with inbound address translation, a doorbell register, scratchpads and
// the link state. The emulated device (OpenShm) implements it over a
// shared-memory file; hardware bridges (Intel, AMD, IDT, Switchtec register
// maps behind mmapped PCI BARs) implement the same interface.
//
// The methods are safe for concurrent use. Register-like methods (doorbell,
// scratchpad) never block; DBWait and WaitLink do.
type Device interface {
	// LinkIsUp reports whether the link to the peer is up (ntb_link_is_up).
	LinkIsUp() bool
	// LinkEnable enables the local side of the link (ntb_link_enable).
	LinkEnable() error
	// LinkDisable takes the local side of the link down (ntb_link_disable).
	LinkDisable() error
	// LinkEvents delivers link changes (the link_event callback). Events
	// that find the channel full are dropped; LinkIsUp has the truth.
	LinkEvents() <-chan LinkEvent
	// PeerIncarnation changes whenever the peer (re)attaches, so a
	// restart that the link poll did not see is still noticed.
	PeerIncarnation() uint32

	// Memory is the local host memory that inbound windows translate into
	// (for hardware: a DMA-mapped buffer). Offsets into it are the
	// addresses MWSetTrans takes.
	Memory() []byte
	// MWCount is the number of inbound memory windows (ntb_mw_count).
	MWCount() int
	// MWGetAlign returns the alignment of a window's translated address
	// and size, and its largest size (ntb_mw_get_align).
	MWGetAlign(widx int) (addrAlign, sizeAlign, sizeMax uint64, err error)
	// MWSetTrans makes the peer's writes to its outbound window widx land
	// in Memory()[addr:addr+size] (ntb_mw_set_trans).
	MWSetTrans(widx int, addr, size uint64) error
	// MWClearTrans removes the translation of window widx
	// (ntb_mw_clear_trans).
	MWClearTrans(widx int) error
	// PeerMWCount is the number of outbound windows (ntb_peer_mw_count).
	PeerMWCount() int
	// PeerMW maps outbound window widx: stores land in the peer's memory
	// at the peer's translation (ntb_peer_mw_get_addr plus a mapping). It
	// fails if the peer has set no translation. The mapping stays valid
	// until the link goes down.
	PeerMW(widx int) ([]byte, error)

	// DBValidMask returns the implemented doorbell bits.
	DBValidMask() uint64
	// DBRead returns the local doorbell bits that are set.
	DBRead() uint64
	// DBClear clears local doorbell bits.
	DBClear(bits uint64) error
	// DBSetMask masks doorbell bits: masked bits still latch but do not
	// wake DBWait.
	DBSetMask(bits uint64) error
	// DBClearMask unmasks doorbell bits.
	DBClearMask(bits uint64) error
	// DBReadMask returns the mask.
	DBReadMask() uint64
	// PeerDBSet rings the peer's doorbell bits (ntb_peer_db_set).
	PeerDBSet(bits uint64) error
	// DBWait sleeps until one of bits is set and unmasked (it returns
	// them, without clearing them), ctx is done (it returns ctx.Err()), or
	// WakeLocal is called (it returns 0 and nil: callers re-check their
	// state). Link changes call WakeLocal.
	DBWait(ctx context.Context, bits uint64) (uint64, error)
	// WakeLocal wakes every local DBWait (used by Close and link events).
	WakeLocal()

	// SpadCount returns the number of scratchpads on each side.
	SpadCount() int
	// SpadRead reads a local scratchpad (which the peer writes).
	SpadRead(idx int) (uint32, error)
	// SpadWrite writes a local scratchpad.
	SpadWrite(idx int, v uint32) error
	// PeerSpadRead reads one of the peer's scratchpads.
	PeerSpadRead(idx int) (uint32, error)
	// PeerSpadWrite writes one of the peer's scratchpads.
	PeerSpadWrite(idx int, v uint32) error

	// Close detaches from the bridge: the peer sees the link go down.
	Close() error
}

// Messenger is implemented by a Device whose bridge has message
// registers (IDT's switches have them and no scratchpads; Switchtec's
// have both). It is Linux's ntb_msg_* API for one peer. A message
// register holds one 32-bit message from the moment the peer writes it
// until this side clears its status bit; while it is set, the peer's
// next message into that register is refused (ErrMsgBusy) and never
// overwrites it. So, unlike a scratchpad, a message is delivered exactly
// once and in order per register.
type Messenger interface {
	// MsgCount returns the number of message registers in each
	// direction (ntb_msg_count).
	MsgCount() int
	// MsgStatus returns a bit per inbound message register that holds
	// a message not yet cleared (ntb_msg_read_sts, inbound bits).
	MsgStatus() uint64
	// MsgClear clears inbound status bits, freeing those registers for
	// the peer's next messages (ntb_msg_clear_sts).
	MsgClear(bits uint64) error
	// MsgRead reads inbound message register idx (ntb_msg_read). It
	// does not clear its status.
	MsgRead(idx int) (uint32, error)
	// PeerMsgWrite sends v through message register idx
	// (ntb_peer_msg_write). If the peer has not cleared the register's
	// last message, nothing is delivered and the error wraps ErrMsgBusy:
	// the caller sends again later.
	PeerMsgWrite(idx int, v uint32) error
}

// ErrMsgBusy is returned by Messenger.PeerMsgWrite when the peer still
// holds the register's previous message.
var ErrMsgBusy = errors.New("ntb: the peer has not taken the previous message in that register")

// LinkEvent is a change of the link state.
type LinkEvent struct {
	Up bool
	// PeerIncarnation identifies the peer instance that is attached.
	PeerIncarnation uint32
}

// ErrBusy is returned when both sides of an emulated bridge are taken.
var ErrBusy = errors.New("ntb: both sides of the bridge are in use")
