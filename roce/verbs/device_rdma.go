//go:build linux && cgo && rdma

package verbs

/*
#include "weft_verbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"github.com/weft-io/weft/fabric"
)

// Supported reports whether this build has the libibverbs binding.
const Supported = true

// Devices lists the RDMA devices with their ports and GID tables. On a
// kernel without RDMA support libibverbs fails with ENOSYS rather than
// returning an empty list; Devices maps that (and an empty list) to an
// empty result and an error matching ErrNoDevice.
func Devices() ([]DeviceInfo, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		if errors.Is(err, syscall.ENOSYS) {
			return nil, fmt.Errorf("%w: the kernel has no RDMA support (ibv_get_device_list: ENOSYS)", ErrNoDevice)
		}
		return nil, &fabric.OpError{Op: "ibv_get_device_list", Backend: "verbs", Err: err}
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	var out []DeviceInfo
	for _, d := range devs {
		info, err := queryDevice(d)
		if err != nil {
			return out, err
		}
		out = append(out, info)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: ibv_get_device_list found none", ErrNoDevice)
	}
	return out, nil
}

func queryDevice(d *C.struct_ibv_device) (DeviceInfo, error) {
	info := DeviceInfo{Name: C.GoString(C.ibv_get_device_name(d)), GUID: uint64(C.ibv_get_device_guid(d))}
	ctx, err := C.ibv_open_device(d)
	if ctx == nil {
		return info, &fabric.OpError{Op: "ibv_open_device " + info.Name, Backend: "verbs", Err: err}
	}
	defer C.ibv_close_device(ctx)
	return queryContext(info, ctx)
}

// queryContext fills in info from an open device context.
func queryContext(info DeviceInfo, ctx *C.struct_ibv_context) (DeviceInfo, error) {
	var attr C.struct_ibv_device_attr
	if rc := C.ibv_query_device(ctx, &attr); rc != 0 {
		return info, &fabric.OpError{Op: "ibv_query_device " + info.Name, Backend: "verbs", Err: syscall.Errno(rc)}
	}
	info.MaxQPWR = int(attr.max_qp_wr)
	info.MaxSGE = int(attr.max_sge)
	info.MaxCQE = int(attr.max_cqe)
	info.MaxMRSize = uint64(attr.max_mr_size)
	info.MaxQPRdAtom = int(attr.max_qp_rd_atom)
	info.MaxQPInitRdAtom = int(attr.max_qp_init_rd_atom)
	info.Atomics = attr.atomic_cap != C.IBV_ATOMIC_NONE
	for p := 1; p <= int(attr.phys_port_cnt); p++ {
		port, err := queryPort(ctx, uint8(p))
		if err != nil {
			return info, err
		}
		info.Ports = append(info.Ports, port)
	}
	return info, nil
}

func queryPort(ctx *C.struct_ibv_context, p uint8) (PortInfo, error) {
	var state, mtu, ll, tbl, lid C.uint32_t
	if rc := C.weft_port(ctx, C.uint8_t(p), &state, &mtu, &ll, &tbl, &lid); rc != 0 {
		return PortInfo{}, &fabric.OpError{Op: "ibv_query_port", Backend: "verbs", Err: syscall.Errno(rc)}
	}
	port := PortInfo{Num: p, Active: state == C.IBV_PORT_ACTIVE, ActiveMTU: 128 << int(mtu),
		Ethernet: ll == C.IBV_LINK_LAYER_ETHERNET, LID: uint16(lid)}
	for i := 0; i < int(tbl); i++ {
		var g [16]byte
		var typ, ifx C.uint32_t
		rc := C.weft_gid(ctx, C.uint8_t(p), C.uint32_t(i), (*C.uint8_t)(unsafe.Pointer(&g[0])), &typ, &ifx)
		if rc != 0 {
			continue // an empty entry (ENODATA) or one this kernel cannot report
		}
		if g == ([16]byte{}) {
			continue
		}
		port.GIDs = append(port.GIDs, GIDEntry{Index: i, GID: g, Type: GIDType(typ), Ifindex: int(ifx)})
	}
	return port, nil
}

// FindGID returns the device, port and GID index of the RoCEv2 GID for ip
// (an IPv4 address is looked up as its IPv4-mapped GID). dev, if not
// empty, restricts the search to that device.
func FindGID(devs []DeviceInfo, dev string, ip netip.Addr) (string, uint8, int, error) {
	want := netip.AddrFrom16(ip.As16())
	for _, d := range devs {
		if dev != "" && d.Name != dev {
			continue
		}
		for _, p := range d.Ports {
			for _, g := range p.GIDs {
				if g.Type == GIDRoCEv2 && netip.AddrFrom16(g.GID) == want {
					return d.Name, p.Num, g.Index, nil
				}
			}
		}
	}
	return "", 0, 0, fmt.Errorf("verbs: no RoCEv2 GID for %v on %q: %w", ip, dev, fabric.ErrInvalid)
}
