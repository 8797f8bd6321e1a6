package roce_test

import (
	"context"
	"log"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/roce" // registers the "roce" backend
)

// A server accepts any number of peers on one exchange port; each is an
// endpoint of its own on the process's one engine.
func ExampleListener() {
	ctx := context.Background()
	l, err := fabric.Listen(ctx, "roce", "10.0.0.1:18515", &fabric.Options{Backlog: 256})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for {
		ep, err := l.Accept(ctx)
		if err != nil {
			return // os.ErrClosed once l is closed
		}
		go func() {
			defer ep.Close()
			// ... ep.RecvWait, ep.Send ...
		}()
	}
	// A client: fabric.Open(ctx, "roce", "10.0.0.1:18515", nil); past a
	// full backlog it fails with an error matching fabric.ErrRefused.
}
