package sock

import (
	"net"
	"testing"

	"golang.org/x/net/nettest"
)

// TestNettest runs x/net's net.Conn conformance suite over every backend.
func TestNettest(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			a, b := connPair(t, be, nil)
			return a, b, func() { a.Close(); b.Close() }, nil
		})
	})
}
