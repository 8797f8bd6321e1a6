package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// One node per machine: the verbs back-plane joins machines, each with
// its RDMA device, rather than namespaces of one host. Every machine runs
// the same command with its own -rank; each builds its node's part of the
// topology (BuildMachineTopology), runs its node, generator and sink, and
// the machines keep in step over a control connection, a TCP connection
// from every machine to rank 0 beside the back-plane (ctlPort on rank 0's
// address). They meet at three points of every size:
//
//   - "ready": every sink listens, so no packet that a node hands across
//     the back-plane reaches a sink that is not there yet;
//   - "sent": every generator has finished, so no sink stops while
//     another machine's packets are still on their way to it;
//   - "row": each machine's generator, sink and node results go to rank 0,
//     which merges them into the cluster's row (mergeRows) and reports.
//
// A machine that fails says so at the next point, and every machine
// stops there. One-way latency is not measured: the generator's and the
// sink's clocks are on different machines.

// Machine is this machine's place in a cluster with one node per machine.
type Machine struct {
	Rank  int
	Addrs []netip.Addr // every node's back-plane address, by rank

	port   uint16     // of the control connection (0: ctlPort)
	start  time.Time  // when the run began (connect)
	conns  []*ctlConn // rank 0: one per other machine, by rank; others: [rank 0]
	broken error      // the first failure: every later meeting returns it
}

// ctlConn is one control connection, read and written as JSON lines.
type ctlConn struct {
	c   net.Conn
	r   *bufio.Reader
	enc *json.Encoder
}

// ctlMsg is what a machine says at a meeting point.
type ctlMsg struct {
	Rank int    `json:"rank"`
	Step string `json:"step"`
	Err  string `json:"err,omitempty"`
	Row  *Row   `json:"row,omitempty"`
}

// ctlWait bounds one meeting: the slowest machine's node start (its FIB)
// or generator run, on emulated machines.
const ctlWait = 3 * time.Minute

// ErrMachine is a failure that another machine of the cluster reported.
var ErrMachine = errors.New("another machine of the cluster failed")

// connect makes the control connections: rank 0 accepts one from every
// other machine, the others dial rank 0 until it listens or ctx is done.
func (m *Machine) connect(ctx context.Context) error {
	n := len(m.Addrs)
	if m.Rank < 0 || m.Rank >= n {
		return fmt.Errorf("-rank %d of %d machines", m.Rank, n)
	}
	m.start = time.Now()
	ctx, cancel := context.WithTimeout(ctx, ctlWait)
	defer cancel()
	port := m.port
	if port == 0 {
		port = ctlPort
	}
	addr := netip.AddrPortFrom(m.Addrs[0], port).String()
	if m.Rank > 0 {
		var d net.Dialer
		for {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				m.conns = []*ctlConn{newCtlConn(c)}
				return m.conns[0].send(ctlMsg{Rank: m.Rank, Step: "hello"})
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("control connection to %s: %w", addr, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	m.conns = make([]*ctlConn, n)
	for got := 1; got < n; {
		c, err := ln.Accept()
		if err != nil {
			m.close()
			return fmt.Errorf("control connections: %d of %d machines: %w", got, n, err)
		}
		cc := newCtlConn(c)
		msg, err := cc.recv(time.Now().Add(10 * time.Second))
		if err != nil || msg.Step != "hello" || msg.Rank <= 0 || msg.Rank >= n || m.conns[msg.Rank] != nil {
			c.Close() // not one of ours, or a duplicate
			continue
		}
		m.conns[msg.Rank] = cc
		got++
	}
	return nil
}

func newCtlConn(c net.Conn) *ctlConn {
	return &ctlConn{c: c, r: bufio.NewReader(c), enc: json.NewEncoder(c)}
}

func (c *ctlConn) send(msg ctlMsg) error {
	c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.enc.Encode(msg)
}

func (c *ctlConn) recv(deadline time.Time) (ctlMsg, error) {
	var msg ctlMsg
	c.c.SetReadDeadline(deadline)
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return msg, err
	}
	return msg, json.Unmarshal(line, &msg)
}

// close closes the control connections.
func (m *Machine) close() {
	for _, c := range m.conns {
		if c != nil {
			c.c.Close()
		}
	}
}

// meet is one meeting point: this machine reports its part (or failure)
// and waits for the others. Rank 0 gets every machine's row, in rank
// order, and tells every machine whether all went well; the others get
// only that answer. The first failure anywhere ends every machine's run
// (ErrMachine when it was another machine's). A nil Machine, a run on one
// host, has no one to meet.
func (m *Machine) meet(ctx context.Context, step string, row *Row, failed error) ([]Row, error) {
	if m == nil {
		return nil, failed
	}
	if m.broken != nil {
		return nil, m.broken
	}
	msg := ctlMsg{Rank: m.Rank, Step: step, Row: row}
	if failed != nil {
		msg.Err = failed.Error()
	}
	deadline := time.Now().Add(ctlWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	stop := context.AfterFunc(ctx, m.close)
	defer stop()
	var rows []Row
	var err error
	if m.Rank > 0 {
		c := m.conns[0]
		if err = c.send(msg); err == nil {
			var ans ctlMsg
			if ans, err = c.recv(deadline); err == nil && ans.Err != "" {
				err = fmt.Errorf("%w: %s", ErrMachine, ans.Err)
			}
		}
	} else {
		if row != nil {
			rows = append(rows, *row)
		}
		var fails []string
		if failed != nil {
			fails = append(fails, "machine 0: "+failed.Error())
		}
		for r, c := range m.conns[1:] {
			got, rerr := c.recv(deadline)
			switch {
			case rerr != nil:
				fails = append(fails, fmt.Sprintf("machine %d: control connection: %v", r+1, rerr))
			case got.Err != "":
				fails = append(fails, fmt.Sprintf("machine %d: %s", r+1, got.Err))
			case got.Step != step:
				fails = append(fails, fmt.Sprintf("machine %d: at %q, want %q", r+1, got.Step, step))
			case got.Row != nil:
				rows = append(rows, *got.Row)
			}
		}
		ans := ctlMsg{Step: step}
		if len(fails) > 0 {
			ans.Err = fmt.Sprint(fails)
			err = fmt.Errorf("%w: %s", ErrMachine, ans.Err)
		}
		for _, c := range m.conns[1:] {
			c.send(ans) // a machine that is gone already failed above
		}
	}
	if err == nil && failed != nil {
		err = failed
	}
	if err != nil {
		m.broken = err
		m.close()
	}
	return rows, err
}

// mergeRows makes the cluster's row of one back-plane and size from the
// machines' parts, in rank order: the generators', sinks' and nodes'
// counts added up, the rates computed again. Per-port and per-socket
// counters follow rank order, each machine having one port of each.
// Latency and CPU stay unmeasured (zero, nil): they would mix clocks and
// machines.
func mergeRows(parts []Row) Row {
	r := Row{Backplane: parts[0].Backplane, Nodes: parts[0].Nodes, Size: parts[0].Size, Settings: parts[0].Settings}
	for _, p := range parts {
		g, s := p.Gen, p.Sink
		r.Gen.Sent += g.Sent
		r.Gen.Unsent += g.Unsent
		r.Gen.LinkDrops += g.LinkDrops
		r.Gen.Skipped += g.Skipped
		r.Gen.Seconds = max(r.Gen.Seconds, g.Seconds)
		for k, v := range g.Bad {
			if r.Gen.Bad == nil {
				r.Gen.Bad = map[string]uint64{}
			}
			r.Gen.Bad[k] += v
		}
		r.Sink.Received += s.Received
		r.Sink.Bytes += s.Bytes
		r.Sink.Reordered += s.Reordered
		r.Sink.Bad += s.Bad
		r.Sink.Seconds = max(r.Sink.Seconds, s.Seconds)
		r.Sink.PerPort = append(r.Sink.PerPort, s.PerPort...)
		r.Sink.Kernel = append(r.Sink.Kernel, s.Kernel...)
		r.NodeStats = append(r.NodeStats, p.NodeStats...)
	}
	r.setRates()
	return r
}

// checkMachineRun checks that a run has one node per machine (machine
// non-nil) exactly when its back-planes join machines (verbs), and asks
// nothing of it that needs every node on one host: the parameter search
// and killing a node.
func checkMachineRun(bps []string, machine *Machine, tune bool, kill int) error {
	for _, bp := range bps {
		backend, _ := splitBackplane(bp)
		switch {
		case machine == nil && backend == "verbs":
			return fmt.Errorf("back-plane %s: %w", bp, errNeedAddrs)
		case machine != nil && backend != "verbs":
			return fmt.Errorf("-addrs: back-plane %s runs on one host; with one node per machine, want verbs or verbs+batch", bp)
		}
	}
	switch {
	case machine == nil:
	case len(machine.Addrs) < 2 || len(machine.Addrs) > maxNodes:
		return fmt.Errorf("-addrs: %d nodes, want 2 to %d", len(machine.Addrs), maxNodes)
	case tune || kill >= 0:
		return errors.New("-addrs: -tune and -kill need every node on one host")
	}
	return nil
}

// machineName is how logs name machine rank r.
func machineName(r int) string { return "machine " + strconv.Itoa(r) }
