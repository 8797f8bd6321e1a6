package roce

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// TestListenerEndpointFails: a listener whose endpoint for a connection
// cannot be made (here its engine's address runs with other options)
// drops that connection, and the dialer fails; the listener lives on.
func TestListenerEndpointFails(t *testing.T) {
	port := uint16(freePort(t))
	held, release, err := acquireEngine(netip.AddrPortFrom(engineAddr, port), engineOpts{NoRaw: true, NoICRC: true})
	if err != nil {
		t.Skip("no engine at", engineAddr, port, err)
	}
	defer release()
	_ = held
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// On the unspecified address the listener makes each connection's
	// engine at the address the connection came to.
	l, err := fabric.Listen(ctx, "roce", "0.0.0.0:0?raw=0&port="+itoa(int(port)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, tcpPort, _ := net.SplitHostPort(l.Addr())
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	ep, err := fabric.Open(dctx, "roce", "127.0.0.1:"+tcpPort+"?raw=0&local=127.0.0.2&port="+itoa(int(port)), nil)
	dcancel()
	if err == nil {
		ep.Close()
		t.Fatal("the dial succeeded: the listener made an endpoint on an engine it cannot have")
	}
	actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer acancel()
	if a, err := l.Accept(actx); err == nil {
		a.Close()
		t.Fatal("the listener offered an endpoint it could not make")
	}
}
