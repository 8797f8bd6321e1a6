package exchange

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/wire"
)

// PerftestKeys is the per-QP message perftest's programs (ib_send_lat,
// ib_write_bw, ib_read_lat, ...) exchange in their default, non-rdma_cm
// mode: the text
//
//	LLLL:OOOO:QQQQQQ:PPPPPP:RRRRRRRR:VVVVVVVVVVVVVVVV:g0:...:g15:SSSSSSSS:
//
// (LID, outstanding reads, QPN, PSN, rkey, virtual address, the 16 GID
// bytes, SRQ number) in a 108-byte NUL-terminated buffer. See INTEROP.md,
// section 3.
type PerftestKeys struct {
	LID      uint16
	OutReads uint16
	QPN      uint32
	PSN      wire.PSN
	RKey     uint32
	VA       uint64
	GID      wire.GID
	SRQN     uint32
}

// perftestKeysSize is the size of a keys message.
const perftestKeysSize = 108

// PerftestVersion is the version Weft announces; perftest refuses peers
// older than 5.70.
const PerftestVersion = "6.06"

// Marshal formats the keys message.
func (k PerftestKeys) Marshal() [perftestKeysSize]byte {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%04x:%04x:%06x:%06x:%08x:%016x:", k.LID, k.OutReads, k.QPN&0xffffff, uint32(k.PSN)&0xffffff, k.RKey, k.VA)
	for _, g := range k.GID {
		fmt.Fprintf(&sb, "%02x:", g)
	}
	fmt.Fprintf(&sb, "%08x:", k.SRQN)
	var b [perftestKeysSize]byte
	copy(b[:], sb.String())
	return b
}

// parsePerftestKeys parses a keys message.
func parsePerftestKeys(b []byte) (PerftestKeys, error) {
	var k PerftestKeys
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 6+16+1 {
		return k, fmt.Errorf("roce: perftest keys %q: %w", s, fabric.ErrMalformed)
	}
	vals := make([]uint64, len(f))
	for i, x := range f {
		v, err := strconv.ParseUint(x, 16, 64)
		if err != nil {
			return k, fmt.Errorf("roce: perftest keys %q: %w", s, fabric.ErrMalformed)
		}
		vals[i] = v
	}
	k.LID, k.OutReads, k.QPN, k.PSN = uint16(vals[0]), uint16(vals[1]), uint32(vals[2])&0xffffff, wire.PSN(vals[3])&wire.PSNMask
	k.RKey, k.VA = uint32(vals[4]), vals[5]
	for i := range k.GID {
		k.GID[i] = byte(vals[6+i])
	}
	k.SRQN = uint32(vals[22])
	return k, nil
}

// PerftestConn speaks perftest's TCP protocol: every unit is exchanged
// with the client writing first and the server reading first, each unit
// in one write.
type PerftestConn struct {
	conn   net.Conn
	client bool
	// MTU is the path MTU agreed in the preamble.
	MTU int
}

// NewPerftestConn wraps an established connection; client says which
// side this is.
func NewPerftestConn(conn net.Conn, client bool) *PerftestConn {
	return &PerftestConn{conn: conn, client: client}
}

// xchg sends out and receives len(in) bytes, in the order of the side.
func (c *PerftestConn) xchg(out, in []byte) error {
	if c.client {
		if _, err := c.conn.Write(out); err != nil {
			return err
		}
		_, err := io.ReadFull(c.conn, in)
		return err
	}
	if _, err := io.ReadFull(c.conn, in); err != nil {
		return err
	}
	_, err := c.conn.Write(out)
	return err
}

// mtuEnum maps a path MTU to verbs' enum ibv_mtu.
func mtuEnum(mtu int) int {
	for e, m := 1, 256; e <= 5; e, m = e+1, m*2 {
		if m == mtu {
			return e
		}
	}
	return 0
}

// Preamble runs the version, system data and MTU exchanges, proposing
// mtu. It sets c.MTU to the agreed value.
func (c *PerftestConn) Preamble(ctx context.Context, mtu int) error {
	defer WatchDeadline(ctx, c.conn)()
	var ver [16]byte
	copy(ver[:], PerftestVersion)
	var rver [16]byte
	if err := c.xchg(ver[:], rver[:]); err != nil {
		return fmt.Errorf("roce: perftest version: %w", err)
	}
	rv := strings.TrimRight(string(rver[:]), "\x00")
	if f, err := strconv.ParseFloat(rv, 64); err != nil || f < 5.70 {
		return fmt.Errorf("roce: perftest peer version %q: need 5.70 or newer", rv)
	}
	var u, ru [4]byte
	binary.BigEndian.PutUint32(u[:], 4096) // cycle buffer: the page size
	if err := c.xchg(u[:], ru[:]); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(u[:], 64) // cache line
	if err := c.xchg(u[:], ru[:]); err != nil {
		return err
	}
	m := [2]byte{byte('0' + mtuEnum(mtu)), 0}
	var rm [2]byte
	if err := c.xchg(m[:], rm[:]); err != nil {
		return err
	}
	c.MTU = mtu
	if e := int(rm[0] - '0'); e >= 1 && e <= 5 && 128<<e < mtu {
		c.MTU = 128 << e
	}
	return nil
}

// HandShake exchanges keys messages: the first carries the connection
// data, later ones serve as barriers between the phases of a test.
func (c *PerftestConn) HandShake(ctx context.Context, mine PerftestKeys) (PerftestKeys, error) {
	defer WatchDeadline(ctx, c.conn)()
	out := mine.Marshal()
	var in [perftestKeysSize]byte
	if err := c.xchg(out[:], in[:]); err != nil {
		return PerftestKeys{}, fmt.Errorf("roce: perftest handshake: %w", err)
	}
	return parsePerftestKeys(in[:])
}

// Exchange8 exchanges one 8-byte unit (the bandwidth report of
// ib_write_bw).
func (c *PerftestConn) Exchange8(ctx context.Context, v uint64) (uint64, error) {
	defer WatchDeadline(ctx, c.conn)()
	var out, in [8]byte
	binary.BigEndian.PutUint64(out[:], v)
	if err := c.xchg(out[:], in[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(in[:]), nil
}

// Close writes "done" and closes the connection, as perftest does.
func (c *PerftestConn) Close() error {
	c.conn.Write([]byte("done\x00"))
	return c.conn.Close()
}
