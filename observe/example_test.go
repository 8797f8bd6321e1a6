package observe_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb"
	"github.com/weft-io/weft/observe"
)

// A program registers its endpoints and serves the registry; `weft
// status -addr URL` and `weft watch -addr URL` read it.
func ExampleRegistry_Handler() {
	dir, _ := os.MkdirTemp("", "weft-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "bridge")
	ctx := context.Background()
	peer := make(chan fabric.Endpoint)
	go func() {
		ep, err := fabric.Open(ctx, "ntb", path, nil)
		if err != nil {
			log.Fatal(err)
		}
		peer <- ep
	}()
	ep, err := fabric.Open(ctx, "ntb", path, nil)
	if err != nil {
		log.Fatal(err)
	}
	other := <-peer
	defer other.Close()
	defer ep.Close()

	reg := observe.NewRegistry("example")
	reg.AddEndpoint("link0", ep, true) // the registry reads ep.Events()
	srv := httptest.NewServer(reg.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/snapshot")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	s := reg.Snapshot()
	fmt.Println(resp.Status, s.Sources[0].Name, s.Sources[0].Backend, s.Sources[0].State)
	// Output: 200 OK link0 ntb up
}
