package ethernet_test

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/internal/netns"
	"golang.org/x/sys/unix"
)

func TestLinkInfo(t *testing.T) {
	p := newPair(t, netns.PairConfig{Queues: 4, MTU: 3000})
	var li ethernet.LinkInfo
	var addrs []netip.Prefix
	require.NoError(t, p.A.Do(func() error {
		var err error
		if li, err = ethernet.LinkByName(p.NameA); err != nil {
			return err
		}
		addrs, err = ethernet.Addrs(li.Index)
		return err
	}))
	require.Equal(t, p.NameA, li.Name)
	require.Equal(t, p.MACA, li.MAC)
	require.Equal(t, 3000, li.MTU)
	require.Equal(t, 4, li.RXQueues)
	require.Equal(t, 4, li.TXQueues)
	require.True(t, li.Up)
	require.Equal(t, "veth", li.Kind)
	require.Contains(t, addrs, netip.MustParsePrefix("10.11.0.1/24"))

	err := p.A.Do(func() error { _, err := ethernet.LinkByName("nosuch0"); return err })
	require.Error(t, err)

	// A link whose operational state is unknown (lo) runs when it is
	// up (IFF_RUNNING), not otherwise.
	for _, up := range []bool{false, true} {
		if up {
			require.NoError(t, p.A.Up("lo"))
		} else {
			require.NoError(t, p.A.Down("lo"))
		}
		require.NoError(t, p.A.Do(func() error { li, err = ethernet.LinkByName("lo"); return err }))
		require.Equal(t, up, li.Up, "lo up")
		require.Equal(t, up, li.Running, "lo running")
	}
}

func TestLinkWatch(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	idx, err := p.A.Index(p.NameA)
	require.NoError(t, err)
	evs := make(chan ethernet.LinkEvent, 16)
	var w *ethernet.LinkWatcher
	require.NoError(t, p.A.Do(func() error {
		var err error
		w, err = ethernet.WatchLink(idx, func(e ethernet.LinkEvent) { evs <- e })
		return err
	}))
	defer w.Close()
	// Another interface going up and down is not reported; its events
	// come before the one below.
	require.NoError(t, p.A.Up("lo"))
	require.NoError(t, p.A.Down("lo"))
	// The peer going down takes our carrier away.
	require.NoError(t, p.B.Down(p.NameB))
	select {
	case e := <-evs:
		require.Equal(t, idx, e.Index, "an event of another interface: %+v", e)
		require.False(t, e.Running)
		require.True(t, e.Up)
	case <-time.After(3 * time.Second):
		t.Fatal("no link-down event")
	}
	require.NoError(t, p.B.Up(p.NameB))
	select {
	case e := <-evs:
		require.True(t, e.Running)
	case <-time.After(3 * time.Second):
		t.Fatal("no link-up event")
	}
	require.NoError(t, w.Close())
	require.NoError(t, w.Close())
}

// TestLinkOutOfDescriptors: with no file descriptor left for a netlink
// socket, the link queries fail with an error, not a panic.
func TestLinkOutOfDescriptors(t *testing.T) {
	var lim unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &lim))
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	// Fill every free descriptor below a limit just above the ones
	// open, then query.
	low := lim
	low.Cur = uint64(len(ents)) + 64
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
	defer func() { require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)) }()
	var fill []int
	defer func() {
		for _, fd := range fill {
			unix.Close(fd)
		}
	}()
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EMFILE) {
			break
		}
		require.NoError(t, err)
		fill = append(fill, fd)
		require.Less(t, len(fill), 1<<16, "never ran out of descriptors")
	}
	_, errName := ethernet.LinkByName("lo")
	_, errIndex := ethernet.LinkByIndex(1)
	_, errAddrs := ethernet.Addrs(1)
	for _, fd := range fill {
		unix.Close(fd)
	}
	fill = nil
	require.Error(t, errName, "LinkByName with no descriptor left")
	require.Error(t, errIndex, "LinkByIndex with no descriptor left")
	require.Error(t, errAddrs, "Addrs with no descriptor left")
}
