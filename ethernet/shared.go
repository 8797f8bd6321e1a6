package ethernet

import (
	"fmt"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// Ports of one process on the same interface share Weft's XDP program:
// an interface has one XDP program, so a second Port (or fabric endpoint)
// on another queue of the interface joins the first one's program and
// XSKMAP instead of failing. They must use the same Filter, and each
// queue can have one socket.

type ifaceKey struct {
	netnsDev, netnsIno uint64
	ifindex            int
}

type sharedProg struct {
	key    ifaceKey
	prog   *Program
	filter string
	queues []int // queues with a registered socket
	refs   int
}

var (
	sharedMu sync.Mutex
	shared   = map[ifaceKey]*sharedProg{}
)

// currentNetns identifies the calling thread's network namespace.
func currentNetns() (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, 0, os.NewSyscallError("stat", err)
	}
	return st.Dev, st.Ino, nil
}

// acquireProgram returns the program steering f on li for queues:
// Weft's program already attached by this process, or a new one
// attached with mode. It fails with ErrXDPInUse if another program is
// attached, the filter differs, or a queue is taken.
func acquireProgram(li LinkInfo, f Filter, queues []int, mode AttachMode) (*sharedProg, error) {
	dev, ino, err := currentNetns()
	if err != nil {
		return nil, err
	}
	key := ifaceKey{dev, ino, li.Index}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sp := shared[key]; sp != nil {
		if sp.filter != f.String() {
			return nil, fmt.Errorf("Weft's program on %s steers %s, not %s: %w", li.Name, sp.filter, f, ErrXDPInUse)
		}
		for _, q := range queues {
			if slices.Contains(sp.queues, q) {
				return nil, fmt.Errorf("queue %d of %s already has a Weft socket: %w", q, li.Name, ErrXDPInUse)
			}
		}
		if m := sp.prog.XSKMap().MaxEntries(); slices.Max(queues) >= int(m) {
			return nil, fmt.Errorf("queue %d beyond the XSKMAP's %d entries: %w", slices.Max(queues), m, ErrXDPInUse)
		}
		sp.queues = append(sp.queues, queues...)
		sp.refs++
		return sp, nil
	}
	if li.XDPProgID != 0 {
		// li may predate the detach of this process's own program by
		// the last user of the interface (a dial right after a close):
		// look again.
		if cur, err := LinkByIndex(li.Index); err == nil {
			li.XDPProgID, li.XDPMode = cur.XDPProgID, cur.XDPMode
		}
	}
	if li.XDPProgID != 0 {
		return nil, fmt.Errorf("program id %d attached (mode %d): %w; Weft does not replace it", li.XDPProgID, li.XDPMode, ErrXDPInUse)
	}
	n := max(64, li.RXQueues, slices.Max(queues)+1)
	prog, err := NewProgram(f, n)
	if err != nil {
		return nil, err
	}
	// Attach before binding: veth needs native XDP on the device for
	// AF_XDP in driver mode, and zero-copy drivers set the queue up on
	// attach.
	if err := prog.Attach(li.Index, mode); err != nil {
		prog.Close()
		return nil, err
	}
	sp := &sharedProg{key: key, prog: prog, filter: f.String(), queues: slices.Clone(queues), refs: 1}
	shared[key] = sp
	return sp, nil
}

// release unregisters queues and detaches the program with its last
// user.
func (sp *sharedProg) release(queues []int) error {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	var err error
	for _, q := range queues {
		if e := sp.prog.Unregister(q); e != nil && err == nil {
			err = e
		}
		if i := slices.Index(sp.queues, q); i >= 0 {
			sp.queues = slices.Delete(sp.queues, i, i+1)
		}
	}
	sp.refs--
	if sp.refs == 0 {
		delete(shared, sp.key)
		if e := sp.prog.Close(); e != nil && err == nil {
			err = e
		}
	}
	return err
}
