package exchange

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/weft-io/weft/fabric"
)

// DefaultDialRetry is how long a dial retries an exchange address where
// nobody listens yet, unless told otherwise.
const DefaultDialRetry = 5 * time.Second

// Dial opens the TCP connection of the out-of-band exchange: with listen
// it accepts one connection on hostport, otherwise it dials hostport
// (from local, if valid). A dial retries a refused connection (nobody
// listens there yet) for at most retry (negative: until ctx is done;
// DefaultDialRetry is the backends' default), after which it fails with
// an error matching fabric.ErrRefused. The engine and the verbs backend
// both use it, so both ends speak the same exchange whichever
// implementation they run.
func Dial(ctx context.Context, listen bool, hostport string, local netip.Addr, retry time.Duration) (net.Conn, error) {
	var conn net.Conn
	var err error
	if listen {
		var lc net.ListenConfig
		ln, lerr := lc.Listen(ctx, "tcp", hostport)
		if lerr != nil {
			return nil, lerr
		}
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		conn, err = ln.Accept()
		stop()
		ln.Close()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
	} else {
		d := net.Dialer{}
		if local.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
		}
		start := time.Now()
		for {
			// The server may not listen yet, or not even be up: retry
			// for a while.
			conn, err = d.DialContext(ctx, "tcp", hostport)
			if err == nil || ctx.Err() != nil {
				break
			}
			if _, ok := ctx.Deadline(); !ok && !isRefused(err) {
				break // no deadline: give up on errors other than refusal
			}
			if retry >= 0 && time.Since(start) >= retry {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		if err != nil {
			if isRefused(err) {
				return nil, fmt.Errorf("roce: bootstrap: nobody listens at %s: %w (%w)", hostport, fabric.ErrRefused, err)
			}
			return nil, err
		}
	}
	return conn, nil
}

func isRefused(err error) bool {
	var se interface{ Timeout() bool }
	return errors.As(err, &se) && !se.Timeout() && strings.Contains(err.Error(), "refused")
}
