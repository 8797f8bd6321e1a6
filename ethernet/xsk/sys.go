package xsk

import (
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The syscalls the package makes, behind small functions so that their
// errors always carry the call's name (*os.SyscallError).

func setsockoptPtr(fd, level, opt int, p unsafe.Pointer, n uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), n, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockoptPtr(fd, level, opt int, p unsafe.Pointer, n uintptr) error {
	l := uint32(n)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

func sockopt(name string, fd, level, opt, v int) error {
	if err := unix.SetsockoptInt(fd, level, opt, v); err != nil {
		return os.NewSyscallError("setsockopt "+name, err)
	}
	return nil
}

// sendtoKick is sendto(fd, NULL, 0, MSG_DONTWAIT, NULL, 0): it makes the
// kernel process the TX ring. It returns the raw errno.
func sendtoKick(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

// recvfromKick is recvfrom(fd, NULL, 0, MSG_DONTWAIT, NULL, NULL): it
// wakes the driver to refill from the fill ring and, with busy polling,
// runs the device's NAPI loop.
func recvfromKick(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

func mmap(fd int, off int64, n int, name string) ([]byte, error) {
	b, err := unix.Mmap(fd, off, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, os.NewSyscallError("mmap "+name, err)
	}
	return b, nil
}

// transient reports whether a kick's errno means "try again later"
// rather than failure, as libxdp treats them.
func transient(e unix.Errno) bool {
	switch e {
	case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.EINTR:
		return true
	}
	return false
}

// retire replaces mappings that other goroutines may still be reading
// with anonymous zero pages, so that a late access sees an empty ring (or
// zero bytes) instead of faulting, and the kernel's pages are released
// now. The replacements are unmapped by a cleanup once owner is
// unreachable.
func retire[T any](owner *T, maps [][]byte) {
	var keep [][]byte
	for _, m := range maps {
		if len(m) == 0 {
			continue
		}
		_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&m[0]), uintptr(len(m)), unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_FIXED|unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			unix.Munmap(m) // cannot keep it safe: at least free it
			continue
		}
		keep = append(keep, m)
	}
	if len(keep) > 0 {
		runtime.AddCleanup(owner, func(ms [][]byte) {
			for _, m := range ms {
				unix.Munmap(m)
			}
		}, keep)
	}
}
