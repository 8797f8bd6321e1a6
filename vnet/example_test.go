//go:build linux

package vnet_test

import (
	"context"
	"log"
	"net/http"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb"
	"github.com/weft-io/weft/observe"
	"github.com/weft-io/weft/vnet"
)

// A TAP device over an emulated NTB bridge: run this on both sides of
// the bridge (the other with 10.0.0.2/24), then ping, ssh or iperf3 over
// weft0. Needs CAP_NET_ADMIN.
func ExampleNew() {
	ctx := context.Background()
	ep, err := fabric.Open(ctx, "ntb", "/dev/shm/weft0?maxmsg=72K", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ep.Close()
	b, err := vnet.New(vnet.Config{Name: "weft0"}, ep) // DefaultMTU, brought up
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	// Then: ip addr add 10.0.0.1/24 dev weft0
	log.Printf("%s up, carrier %v", b.Name(), b.Carrier())
}

// Exposing a bridge to `weft status` and `weft watch`.
func ExampleBridge_Observe() {
	ep, err := fabric.Open(context.Background(), "ntb", "/dev/shm/weft0?maxmsg=72K", nil)
	if err != nil {
		log.Fatal(err)
	}
	b, err := vnet.New(vnet.Config{Name: "weft0"}, ep)
	if err != nil {
		log.Fatal(err)
	}
	reg := observe.NewRegistry("myrouter")
	if err := b.Observe(reg, "weft0"); err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe("127.0.0.1:9470", reg.Handler())) // weft status, weft watch
}
