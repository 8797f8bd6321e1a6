package sock_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/weft-io/weft/fabric/sock"
	_ "github.com/weft-io/weft/ntb" // registers the "ntb" backend
)

// A byte stream over an emulated NTB bridge: the listener's Addr is what
// Dial needs; the connections are net.Conns.
func Example() {
	dir, _ := os.MkdirTemp("", "weft-sock")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	l, err := sock.Listen(ctx, "ntb", filepath.Join(dir, "bridge"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client's CloseWrite
	}()

	c, err := sock.Dial(ctx, "ntb", l.Addr().String(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "hello over the fabric")
	c.(*sock.Conn).CloseWrite()
	answer, _ := io.ReadAll(c)
	fmt.Printf("%s (%s)\n", answer, c.RemoteAddr().Network())
	// Output: hello over the fabric (ntb)
}
