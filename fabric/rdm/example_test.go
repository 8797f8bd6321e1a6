package rdm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/rdm"
	_ "github.com/weft-io/weft/ntb"
)

// A server answers a client it never inserted: the client's hello puts
// it in the server's address vector, and Recv reports its handle.
func Example() {
	dir, _ := os.MkdirTemp("", "rdm")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	server, err := rdm.Open(ctx, "ntb", filepath.Join(dir, "bridge"), nil)
	if err != nil {
		panic(err)
	}
	defer server.Close()
	client, err := rdm.Open(ctx, "ntb", "", &rdm.Config{Name: "client"})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	p, _ := client.Insert(server.Name()) // the name is the listener's address
	buf, _ := client.Alloc(64)
	n := copy(buf.Bytes(), "hello")
	client.SendWait(ctx, p, []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: n}}}})

	rbuf, _ := server.Alloc(64)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rbuf)}}}
	from := make([]rdm.Peer, 1)
	server.RecvWait(ctx, msgs, from)
	name, _ := server.Lookup(from[0])
	fmt.Printf("%s from %s\n", rbuf.Bytes()[:msgs[0].Len], name)

	// Answer over the connection the client made.
	server.SendWait(ctx, from[0], []fabric.Message{{SGEs: []fabric.SGE{{Region: rbuf, Length: msgs[0].Len}}}})
	msgs[0].SGEs[0] = fabric.SGEOf(buf)
	client.RecvWait(ctx, msgs, nil)
	fmt.Printf("%s back\n", buf.Bytes()[:msgs[0].Len])
	// Output:
	// hello from client
	// hello back
}
