// Package vnet joins a Linux TAP (or TUN) device to fabric endpoints:
// virtual Ethernet over the fabric, as Linux's ntb_netdev is over
// ntb_transport, but over any Weft backend. Frames the kernel transmits
// on the device cross the fabric, and the peer's device delivers them, so
// ping, kernel TCP and UDP and unmodified programs run over ntb, roce or
// ethernet.
//
//	ep, err := fabric.Open(ctx, "ntb", "/dev/shm/weft0?maxmsg=72K", nil)
//	...
//	b, err := vnet.New(vnet.Config{Name: "weft0"}, ep)
//	// ip addr add 10.0.0.1/24 dev weft0; the peer does the same with .2
//
// # Queues, MTU, offloads
//
// New makes one device queue per endpoint (IFF_MULTI_QUEUE when there
// are several): over ntb, the queues of one transport; over other
// backends, several endpoints. The MTU goes up to MaxMTU (65521 for TAP,
// as Linux allows), DefaultMTU when unset: the best measured over ntb.
// Config.Offload turns on the virtio-net header with checksum and TCP
// segmentation offload, so that the kernel hands over 64 KiB TCP
// super-frames whatever the MTU. Config.MessageSize says how large the
// endpoints' messages must be.
//
// # Link state
//
// The bridge reads its endpoints' events: the device's carrier is off
// while any queue's fabric link is down and on again when every link is
// back (the ntb transport renegotiates under the same endpoints, so
// nothing restarts and open TCP connections carry on). Bridge.Events
// reports the changes; Bridge.Observe records them, and the counters, in
// an observe.Registry for `weft status` and `weft watch`.
//
// # Bad input
//
// Every message from the fabric is checked before the kernel sees it
// (Parse: the Header, the virtio-net header, the frame's minimal shape);
// a bad one is dropped and counted in Stats by reason. Errors wrap
// fabric.ErrMalformed, fabric.ErrInvalid, fabric.ErrMessageSize or
// fabric.ErrNotSupported. Nothing on the data path allocates.
//
// New needs CAP_NET_ADMIN and creates the device in the network namespace
// of the calling thread.
package vnet
