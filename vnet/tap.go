//go:build linux

package vnet

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
)

// TUNSETOFFLOAD flags (include/uapi/linux/if_tun.h); x/sys/unix has the
// ioctl but not these.
const (
	tunFCsum = 0x01
	tunFTSO4 = 0x02
	tunFTSO6 = 0x04
)

// tapQueue is one queue of a TAP/TUN device: a file descriptor bound to
// the device with TUNSETIFF. The fd is non-blocking and registered with
// the Go poller through f.
type tapQueue struct {
	f  *os.File
	fd int
}

// openQueues creates (or attaches to) the device name with n queues and
// returns one file per queue, in the network namespace of the calling
// thread. The kernel picks the name if name is empty.
func openQueues(name string, kind Kind, n int, vnetHdr bool) ([]tapQueue, string, error) {
	flags := uint16(unix.IFF_NO_PI)
	if kind == TUN {
		flags |= unix.IFF_TUN
	} else {
		flags |= unix.IFF_TAP
	}
	if n > 1 {
		flags |= unix.IFF_MULTI_QUEUE
	}
	if vnetHdr {
		flags |= unix.IFF_VNET_HDR
	}
	var qs []tapQueue
	fail := func(op string, err error) ([]tapQueue, string, error) {
		for _, q := range qs {
			q.f.Close()
		}
		if err == unix.EINVAL || err == unix.ENOTTY {
			err = fmt.Errorf("%w: %w", fabric.ErrNotSupported, err)
		}
		return nil, "", &fabric.OpError{Op: op, Backend: "vnet", Addr: name, Err: err}
	}
	for i := 0; i < n; i++ {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			if os.IsNotExist(err) {
				err = fmt.Errorf("/dev/net/tun: %w: %w", fabric.ErrNotSupported, err)
			}
			return fail("open", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return fail("open", fmt.Errorf("%w: %w", fabric.ErrInvalid, err))
		}
		ifr.SetUint16(flags)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fail("TUNSETIFF", err)
		}
		name = ifr.Name()
		if vnetHdr {
			if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, VnetHdrLen); err != nil {
				unix.Close(fd)
				return fail("TUNSETVNETHDRSZ", err)
			}
			off := tunFCsum | tunFTSO4 | tunFTSO6
			if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, off); err != nil {
				unix.Close(fd)
				return fail("TUNSETOFFLOAD", err)
			}
		}
		qs = append(qs, tapQueue{f: os.NewFile(uintptr(fd), "/dev/net/tun:"+name), fd: fd})
	}
	return qs, name, nil
}

// setCarrier turns the device's carrier on or off (TUNSETCARRIER, Linux
// 5.0): with the carrier off the kernel stops queueing to the device and
// reports NO-CARRIER, as a NIC whose cable is out.
func setCarrier(fd int, on bool) error {
	v := 0
	if on {
		v = 1
	}
	return unix.IoctlSetPointerInt(fd, unix.TUNSETCARRIER, v)
}
