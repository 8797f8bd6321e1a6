package main

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The topology is built with iproute2's ip(8), as an operator would, rather
// than with the module's internal/netns (the router keeps to the public
// API, as a user's application would) or a netlink client of its own: every step is one readable command,
// and `ip netns exec` both enters a namespace for a child process and makes
// the namespace visible to the operator (/run/netns) while the run lasts.
//
//	gen ns            node i ns                       sink ns
//	g<i> ---veth--- in  [forwarder]  out ---veth--- s<i>
//	                 b<j> ---veth--- b<i> (node j ns): back-plane, one per pair
//
// Addresses: g<i> 10.1.i.1, in 10.1.i.2; out 10.2.i.1, s<i> 10.2.i.2;
// the pair (i, j), i < j: 10.3.(4i+j).1 on node i, .2 on node j.
// MACs are fixed (02:0K:00:00:i:s) so the generator needs no ARP.

// Topology is a built set of namespaces; Remove deletes them all (and
// with them every veth and every XDP program attached to one).
//
// With one node per machine (BuildMachineTopology: the verbs back-plane)
// a machine holds its node's part only: the generator and sink
// namespaces and the node's ingress and egress veths, without back-plane
// links (the back-plane is the machine's RDMA device). The node then
// stays in the machine's own namespace, because that is where its RDMA
// device works: the rdma_cm resolves addresses in the caller's namespace,
// and Soft-RoCE (rdma_rxe, Linux 6.1 as in Debian 12) sends and receives
// in the initial namespace only, so an RDMA device cannot follow a node
// into a namespace of its own.
type Topology struct {
	Prefix string
	Nodes  int
	// Ranks are the nodes whose links this topology holds: all of them,
	// or the machine's one node.
	Ranks []int
	// machine: the nodes run in this namespace (one node per machine).
	machine bool
	ns      []string
}

func (t *Topology) nsGen() string  { return t.Prefix + "gen" }
func (t *Topology) nsSink() string { return t.Prefix + "sink" }

// nsNode is node i's namespace, "" for the machine's own.
func (t *Topology) nsNode(i int) string {
	if t.machine {
		return ""
	}
	return t.Prefix + "n" + strconv.Itoa(i)
}

// maxNodes is the largest cluster.
const maxNodes = 4

func pairIf(j int) string { return "b" + strconv.Itoa(j) }

// pairIP is node i's address on its back-plane link to node j.
func pairIP(i, j int) netip.Addr {
	lo, hi, host := i, j, byte(1)
	if i > j {
		lo, hi, host = j, i, 2
	}
	return netip.AddrFrom4([4]byte{10, 3, byte(4*lo + hi), host})
}

// pairMAC is node i's MAC on its back-plane link to node j.
func pairMAC(i, j int) net.HardwareAddr {
	if i < j {
		return mac(3, 4*i+j, 1)
	}
	return mac(3, 4*j+i, 2)
}

func mac(kind, i, side int) net.HardwareAddr {
	return net.HardwareAddr{2, byte(kind), 0, 0, byte(i), byte(side)}
}

// inMAC is node i's ingress MAC, genMAC the generator's port to it.
func inMAC(i int) net.HardwareAddr  { return mac(1, i, 2) }
func genMAC(i int) net.HardwareAddr { return mac(1, i, 1) }

// sinkIP is the next hop behind node i's egress port.
func sinkIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 2, byte(i), 2}) }

func ipCmd(args ...string) error {
	var errb bytes.Buffer
	c := exec.Command("ip", args...)
	c.Stderr = &errb
	if err := c.Run(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return nil
}

// runPrefix names this process's namespaces; leftovers of dead runs are
// found by it.
func runPrefix() string { return "wr" + strconv.Itoa(os.Getpid()) + "-" }

// BuildTopology creates the namespaces and links for n nodes. On error it
// removes what it made.
func BuildTopology(n int) (*Topology, error) {
	t := &Topology{Prefix: runPrefix(), Nodes: n}
	for i := range n {
		t.Ranks = append(t.Ranks, i)
	}
	return t, t.build()
}

// BuildMachineTopology creates this machine's part of a cluster of n
// nodes with one node per machine: the generator and sink namespaces and
// node rank's ingress and egress veths, whose node ends stay in this
// namespace (see Topology). On error it removes what it made.
func BuildMachineTopology(rank, n int) (*Topology, error) {
	t := &Topology{Prefix: runPrefix(), Nodes: n, Ranks: []int{rank}, machine: true}
	return t, t.build()
}

// ipIn runs ip(8) with args in namespace ns ("": this one).
func ipIn(ns string, args ...string) error {
	if ns == "" {
		return ipCmd(args...)
	}
	return ipCmd(append([]string{"-n", ns}, args...)...)
}

// veth creates a veth pair between namespaces nsA and nsB (at most one of
// them "", this namespace) with the ends' names, MACs and addresses, and
// sets both up.
func veth(nsA, a string, macA net.HardwareAddr, addrA string, nsB, b string, macB net.HardwareAddr, addrB string) error {
	if nsB == "" { // create it from this namespace, the peer moves
		nsA, a, macA, addrA, nsB, b, macB, addrB = nsB, b, macB, addrB, nsA, a, macA, addrA
	}
	if err := ipIn(nsA, "link", "add", a, "address", macA.String(), "type", "veth",
		"peer", "name", b, "netns", nsB, "address", macB.String()); err != nil {
		return err
	}
	for _, e := range []struct{ ns, dev, addr string }{{nsA, a, addrA}, {nsB, b, addrB}} {
		if err := ipIn(e.ns, "addr", "add", e.addr, "dev", e.dev); err != nil {
			return err
		}
		if err := ipIn(e.ns, "link", "set", e.dev, "up"); err != nil {
			return err
		}
	}
	return nil
}

// build creates t's namespaces and links; on error it removes them.
func (t *Topology) build() (err error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("needs iproute2's ip: %w", err)
	}
	defer func() {
		if err != nil {
			t.Remove()
		}
	}()
	names := []string{t.nsGen(), t.nsSink()}
	for _, i := range t.Ranks {
		if ns := t.nsNode(i); ns != "" {
			names = append(names, ns)
		}
	}
	for _, ns := range names {
		if err := ipCmd("netns", "add", ns); err != nil {
			return err
		}
		t.ns = append(t.ns, ns)
		if err := ipCmd("-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	for _, i := range t.Ranks {
		if err := veth(t.nsGen(), "g"+strconv.Itoa(i), genMAC(i), fmt.Sprintf("10.1.%d.1/24", i),
			t.nsNode(i), "in", inMAC(i), fmt.Sprintf("10.1.%d.2/24", i)); err != nil {
			return err
		}
		if err := veth(t.nsNode(i), "out", mac(2, i, 1), fmt.Sprintf("10.2.%d.1/24", i),
			t.nsSink(), "s"+strconv.Itoa(i), mac(2, i, 2), sinkIP(i).String()+"/24"); err != nil {
			return err
		}
		if t.machine {
			continue
		}
		for j := i + 1; j < t.Nodes; j++ {
			if err := veth(t.nsNode(i), pairIf(j), pairMAC(i, j), pairIP(i, j).String()+"/24",
				t.nsNode(j), pairIf(i), pairMAC(j, i), pairIP(j, i).String()+"/24"); err != nil {
				return err
			}
		}
	}
	return nil
}

// Command returns a command that runs this program with args in
// namespace ns ("": this one). The child dies with us (SIGKILL on our death), so not even
// a crash of this process leaves a forwarder running.
func (t *Topology) Command(ns string, args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := exec.Command(exe, args...)
	if ns != "" {
		c = exec.Command("ip", append([]string{"netns", "exec", ns, exe}, args...)...)
	}
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	c.Stderr = os.Stderr
	c.Env = append(os.Environ(), childEnv+"=1")
	return c, nil
}

// childEnv marks a process of the run started by Command (the test binary
// runs main for it).
const childEnv = "WEFT_ROUTER_CHILD"

// Remove deletes every namespace of the topology. It is idempotent.
func (t *Topology) Remove() error {
	var first error
	for _, ns := range t.ns {
		if err := ipCmd("netns", "del", ns); err != nil && first == nil {
			first = err
		}
	}
	t.ns = nil
	return first
}

// shmPrefix names this process's NTB bridge directories in /dev/shm.
func shmPrefix() string { return "weft-router-" + strconv.Itoa(os.Getpid()) + "-" }

// removeStaleShm removes the bridge directories of runs whose process is
// gone (killed with SIGKILL or by a broken pipe).
func removeStaleShm() {
	m, _ := filepath.Glob("/dev/shm/weft-router-*-*")
	for _, d := range m {
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "weft-router-"), "-")
		if pid, err := strconv.Atoi(pidStr); err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(d)
		}
	}
}

// Leftovers lists namespaces of this program whose run is over: those of
// dead processes, or with all=true every one with our prefix shape.
func Leftovers(all bool) []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil
	}
	var left []string
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(name, "wr"), "-")
		pid, err := strconv.Atoi(pidStr)
		if !strings.HasPrefix(name, "wr") || !ok || err != nil {
			continue
		}
		if all || syscall.Kill(pid, 0) == syscall.ESRCH {
			left = append(left, name)
		}
	}
	return left
}
