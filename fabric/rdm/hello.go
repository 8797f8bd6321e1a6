package rdm

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/weft-io/weft/fabric"
)

// The hello is the first message on every connection, from the dialer:
//
//	"WEFTRDM" version(1) nameLen(2, little endian) name
//
// The name is how the dialer is known (empty: it cannot be dialled).
const (
	helloMagic   = "WEFTRDM"
	helloVersion = 1
	helloHdr     = 10
	maxName      = 1024
	maxHello     = helloHdr + maxName
)

// appendHello appends the hello for name to b.
func appendHello(b []byte, name string) []byte {
	b = append(b, helloMagic...)
	b = append(b, helloVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

// parseHello returns the name a hello carries. Its errors match
// fabric.ErrMalformed.
func parseHello(b []byte) (string, error) {
	switch {
	case len(b) < helloHdr || string(b[:7]) != helloMagic:
		return "", fmt.Errorf("rdm: hello of %d bytes without its magic: %w", len(b), fabric.ErrMalformed)
	case b[7] != helloVersion:
		return "", fmt.Errorf("rdm: hello version %d, want %d: %w", b[7], helloVersion, fabric.ErrMalformed)
	}
	n := int(binary.LittleEndian.Uint16(b[8:]))
	if n > maxName || helloHdr+n != len(b) {
		return "", fmt.Errorf("rdm: hello name of %d bytes in %d: %w", n, len(b), fabric.ErrMalformed)
	}
	return string(b[helloHdr:]), nil
}

// sendHello introduces us on a new connection.
func sendHello(ctx context.Context, ep fabric.Endpoint, name string) error {
	reg, err := ep.Register(appendHello(make([]byte, 0, helloHdr+len(name)), name), 0)
	if err != nil {
		return err
	}
	defer reg.Close()
	inline := reg.Len() <= ep.Caps().InlineSize
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}
	if !inline {
		msgs[0].Flags = fabric.FlagSignal
	}
	if _, err := ep.SendWait(ctx, msgs); err != nil {
		return err
	}
	if inline {
		return nil
	}
	// The buffer belongs to the endpoint until the send completes.
	var out [4]fabric.Completion
	for {
		n, err := ep.CQ().Wait(ctx, out[:])
		if err != nil {
			return err
		}
		for _, c := range out[:n] {
			if err := c.Err(); err != nil {
				return err
			}
			return nil
		}
	}
}

// recvHello reads the hello of an accepted connection.
func recvHello(ctx context.Context, ep fabric.Endpoint) (string, error) {
	reg, err := ep.Register(make([]byte, maxHello+1), fabric.AccessLocalWrite)
	if err != nil {
		return "", err
	}
	defer reg.Close()
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}
	if _, err := ep.RecvWait(ctx, msgs); err != nil {
		return "", err
	}
	if msgs[0].Flags&fabric.FlagTruncated != 0 {
		return "", fmt.Errorf("rdm: hello longer than %d bytes: %w", maxHello, fabric.ErrMalformed)
	}
	return parseHello(reg.Bytes()[:msgs[0].Len])
}
