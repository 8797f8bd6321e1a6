package roce

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/wire"
)

// Dest is what the two ends of a connection tell each other out of band
// before their queue pairs can talk: the LID (unused on RoCE), QP number,
// first PSN and GID. It is what rdma-core's ibv_rc_pingpong and
// ibv_ud_pingpong exchange over TCP port 18515.
type Dest struct {
	LID uint16
	QPN uint32
	PSN wire.PSN
	GID wire.GID
}

// PingpongMsgSize is the size of the message ibv_*_pingpong exchange:
// sizeof "0000:000000:000000:00000000000000000000000000000000", the text
// "LLLL:QQQQQQ:PPPPPP:" and the GID as 32 lower-case hex digits, NUL
// terminated (see INTEROP.md, section 2.1). Each side sends it in one
// write, and reads it whole.
const PingpongMsgSize = 52

// DefaultBootstrapPort is the TCP port of the pingpong programs and
// perftest.
const DefaultBootstrapPort = 18515

// MarshalPingpong formats d as the pingpong programs do.
func (d Dest) MarshalPingpong() [PingpongMsgSize]byte {
	var b [PingpongMsgSize]byte
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN&0xffffff, uint32(d.PSN)&0xffffff, hex.EncodeToString(d.GID[:]))
	copy(b[:], s)
	return b
}

// ParsePingpong parses a pingpong exchange message.
func ParsePingpong(b []byte) (Dest, error) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	f := strings.Split(strings.TrimSpace(string(b)), ":")
	if len(f) != 4 || len(f[3]) != 32 {
		return Dest{}, fmt.Errorf("roce: pingpong address %q: %w", b, fabric.ErrMalformed)
	}
	lid, err1 := strconv.ParseUint(f[0], 16, 16)
	qpn, err2 := strconv.ParseUint(f[1], 16, 24)
	psn, err3 := strconv.ParseUint(f[2], 16, 24)
	g, err4 := hex.DecodeString(f[3])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return Dest{}, fmt.Errorf("roce: pingpong address %q: %w", b, fabric.ErrMalformed)
	}
	var d Dest
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), wire.PSN(psn)
	copy(d.GID[:], g)
	return d, nil
}

func deadlineFrom(ctx context.Context, conn net.Conn) func() {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	return func() { stop(); conn.SetDeadline(time.Time{}) }
}

// ExchangeClient runs the client side of the pingpong exchange on conn:
// send our address, read the server's, send "done".
func ExchangeClient(ctx context.Context, conn net.Conn, local Dest) (Dest, error) {
	defer deadlineFrom(ctx, conn)()
	msg := local.MarshalPingpong()
	if _, err := conn.Write(msg[:]); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: %w", err)
	}
	var in [PingpongMsgSize]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: reading the server's address: %w", err)
	}
	remote, err := ParsePingpong(in[:])
	if err != nil {
		return Dest{}, err
	}
	if _, err := conn.Write([]byte("done\x00")); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: %w", err)
	}
	return remote, nil
}

// ExchangeServer runs the server side of the pingpong exchange: read the
// client's address, call connect with it (the server's QP must be ready
// before the client learns its address), send ours, wait for "done".
func ExchangeServer(ctx context.Context, conn net.Conn, local Dest, connect func(Dest) error) (Dest, error) {
	defer deadlineFrom(ctx, conn)()
	var in [PingpongMsgSize]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: reading the client's address: %w", err)
	}
	remote, err := ParsePingpong(in[:])
	if err != nil {
		return Dest{}, err
	}
	if err := connect(remote); err != nil {
		return Dest{}, err
	}
	msg := local.MarshalPingpong()
	if _, err := conn.Write(msg[:]); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: %w", err)
	}
	var done [5]byte
	if _, err := io.ReadFull(conn, done[:4]); err != nil || string(done[:4]) != "done" {
		return Dest{}, fmt.Errorf("roce: bootstrap: no \"done\" from the client: %v", err)
	}
	return remote, nil
}
