package ethernet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"github.com/weft-io/weft/fabric"
	"golang.org/x/sys/unix"
)

// LinkInfo describes a network interface, as rtnetlink reports it.
type LinkInfo struct {
	// Name and Index identify the interface in its namespace.
	Name  string
	Index int
	// MAC is the hardware address.
	MAC net.HardwareAddr
	// MTU is the IP MTU (the frame is MTU + 14 bytes, more with VLANs).
	MTU int
	// RXQueues and TXQueues are the numbers of queues
	// (IFLA_NUM_RX_QUEUES, IFLA_NUM_TX_QUEUES).
	RXQueues, TXQueues int
	// Up reports administrative up (IFF_UP); Running reports operational
	// up (carrier and IFF_RUNNING / IF_OPER_UP).
	Up, Running bool
	// XDPProgID is the id of the XDP program attached, 0 if none, and
	// XDPMode how it is attached (1 driver, 2 generic, 3 offload, 4
	// multi: the IFLA_XDP_ATTACHED values).
	XDPProgID uint32
	XDPMode   uint8
	// Kind is the driver kind for virtual devices ("veth", ...).
	Kind string
}

func linkErr(op string, err error) error {
	return &fabric.OpError{Op: op, Backend: "ethernet", Err: err}
}

// LinkByName returns information on the named interface.
func LinkByName(name string) (LinkInfo, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.IFLA_IFNAME, name)
	attrs, err := ae.Encode()
	if err != nil {
		return LinkInfo{}, linkErr("link", err)
	}
	li, err := getLink(0, attrs)
	if err != nil {
		return LinkInfo{}, linkErr("link "+name, err)
	}
	return li, nil
}

// LinkByIndex returns information on the interface with index idx.
func LinkByIndex(idx int) (LinkInfo, error) {
	li, err := getLink(uint32(idx), nil)
	if err != nil {
		return LinkInfo{}, linkErr(fmt.Sprintf("link %d", idx), err)
	}
	return li, nil
}

func getLink(idx uint32, attrs []byte) (LinkInfo, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return LinkInfo{}, err
	}
	defer c.Close()
	body := make([]byte, unix.SizeofIfInfomsg, unix.SizeofIfInfomsg+len(attrs))
	putNative32(body[4:], idx)
	body = append(body, attrs...)
	msgs, err := c.Execute(netlink.Message{Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request}, Data: body})
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			// An address that names no interface is a wrong address,
			// as the package documentation says.
			return LinkInfo{}, fmt.Errorf("no such interface: %w: %w", fabric.ErrInvalid, err)
		}
		return LinkInfo{}, err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.RTM_NEWLINK {
			return parseLink(m.Data)
		}
	}
	return LinkInfo{}, errors.New("no link in reply")
}

func parseLink(b []byte) (LinkInfo, error) {
	var lm rtnetlink.LinkMessage
	if err := lm.UnmarshalBinary(b); err != nil {
		return LinkInfo{}, err
	}
	li := LinkInfo{Index: int(lm.Index), Up: lm.Flags&unix.IFF_UP != 0}
	if a := lm.Attributes; a != nil {
		li.Name, li.MAC, li.MTU = a.Name, a.Address, int(a.MTU)
		li.Running = a.OperationalState == rtnetlink.OperStateUp ||
			(a.OperationalState == rtnetlink.OperStateUnknown && lm.Flags&unix.IFF_RUNNING != 0)
		if a.XDP != nil {
			li.XDPProgID, li.XDPMode = a.XDP.ProgID, a.XDP.Attached
		}
		if a.Info != nil {
			li.Kind = a.Info.Kind
		}
	}
	// rtnetlink's LinkAttributes lacks the queue counts; read them here.
	if len(b) > unix.SizeofIfInfomsg {
		ad, err := netlink.NewAttributeDecoder(b[unix.SizeofIfInfomsg:])
		if err == nil {
			for ad.Next() {
				switch ad.Type() {
				case unix.IFLA_NUM_RX_QUEUES:
					li.RXQueues = int(ad.Uint32())
				case unix.IFLA_NUM_TX_QUEUES:
					li.TXQueues = int(ad.Uint32())
				}
			}
		}
	}
	return li, nil
}

// Addrs lists the IP addresses of the interface with index idx.
func Addrs(idx int) ([]netip.Prefix, error) {
	c, err := rtnetlink.Dial(nil)
	if err != nil {
		return nil, linkErr("addrs", err)
	}
	defer c.Close()
	msgs, err := c.Address.List()
	if err != nil {
		return nil, linkErr("addrs", err)
	}
	var out []netip.Prefix
	for _, m := range msgs {
		if int(m.Index) != idx || m.Attributes == nil {
			continue
		}
		ip := m.Attributes.Local
		if ip == nil {
			ip = m.Attributes.Address
		}
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			continue
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), int(m.PrefixLength)))
	}
	return out, nil
}

// LinkEvent is a change of an interface's state.
type LinkEvent struct {
	Index   int
	Name    string
	Up      bool // administratively up
	Running bool // operationally up
	Deleted bool // the interface went away
	Time    time.Time
}

// LinkWatcher reports link state changes of one interface from an
// rtnetlink socket subscribed to the RTNLGRP_LINK multicast group.
type LinkWatcher struct {
	c    *netlink.Conn
	idx  int
	fn   func(LinkEvent)
	done chan struct{}
	once sync.Once
}

// WatchLink subscribes to link changes of the interface with index idx
// (in the calling thread's network namespace) and calls fn, from one
// goroutine, for every change of its up/running state or its deletion,
// until Close.
func WatchLink(idx int, fn func(LinkEvent)) (*LinkWatcher, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{Groups: 1 << (unix.RTNLGRP_LINK - 1)})
	if err != nil {
		return nil, linkErr("watch", err)
	}
	w := &LinkWatcher{c: c, idx: idx, fn: fn, done: make(chan struct{})}
	start, err := LinkByIndex(idx)
	if err != nil {
		c.Close()
		return nil, err
	}
	go w.run(start.Up, start.Running)
	return w, nil
}

func (w *LinkWatcher) run(up, running bool) {
	defer close(w.done)
	for {
		msgs, err := w.c.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				// Missed events: re-read the state.
				if li, err := LinkByIndex(w.idx); err == nil {
					w.report(&up, &running, li, false)
				}
				continue
			}
			return // closed
		}
		for _, m := range msgs {
			if m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK {
				continue
			}
			li, err := parseLink(m.Data)
			if err != nil || li.Index != w.idx {
				continue
			}
			w.report(&up, &running, li, m.Header.Type == unix.RTM_DELLINK)
		}
	}
}

func (w *LinkWatcher) report(up, running *bool, li LinkInfo, deleted bool) {
	if !deleted && li.Up == *up && li.Running == *running {
		return
	}
	*up, *running = li.Up, li.Running
	w.fn(LinkEvent{Index: li.Index, Name: li.Name, Up: li.Up, Running: li.Running && !deleted,
		Deleted: deleted, Time: time.Now()})
}

// Close stops the watcher and waits for its goroutine to end. It is
// idempotent.
func (w *LinkWatcher) Close() error {
	var err error
	w.once.Do(func() {
		err = w.c.Close()
		<-w.done
	})
	return err
}

func putNative32(b []byte, v uint32) {
	if nativeLittle {
		b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	} else {
		b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	}
}
