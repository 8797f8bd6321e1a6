//go:build rxe

package roce

// Interop with Linux Soft-RoCE: the tests boot the rxe VMs of
// ../shared/rxe-vm (kernel rxe, rdma-core, perftest) and run rdma-core's
// and perftest's programs in the guest against this engine on the host
// side of the bridge (10.77.0.1). They need root and the harness; build
// them with -tags rxe:
//
//	go test -tags rxe -run TestRxe -v ./roce/
//
// TestRxeInterop writes the guest script and starts the harness, whose
// host command is this test binary again, running TestRxeHost in the
// harness's namespace. Guest and host walk through the same list of
// steps; the side that is the client of a step retries until the server
// listens.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/ibvpp"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/exchange"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

const guestIP = "10.77.0.2"

// rxeStep is one interop exchange. Guest is the guest's command line;
// Host runs the matching Weft side.
type rxeStep struct {
	Name  string
	Guest string
	Host  func(t *testing.T, ctx context.Context) error
	// XDP: the host side runs with the engine on link=xdp, on br0
	// (xdpRxeSteps; TestRxeHost holds that engine and checks that the
	// step's packets went through its AF_XDP socket).
	XDP bool
}

var rcSizes = []int{1, 64, 1024, 1500, 4096, 65536}
var udSizes = []int{1, 64, 1024}

const rxeIters = 50

// rxeSteps lists the steps; WEFT_RXE_STEPS, a regular expression, keeps
// only the steps whose names it matches (for a quicker VM run while
// working on some of them).
func rxeSteps() []rxeStep {
	re := os.Getenv("WEFT_RXE_STEPS")
	if re == "" {
		return allRxeSteps()
	}
	keep := regexp.MustCompile(re)
	var steps []rxeStep
	for _, s := range allRxeSteps() {
		if keep.MatchString(s.Name) {
			steps = append(steps, s)
		}
	}
	return steps
}

func allRxeSteps() []rxeStep {
	steps := pingpongSteps("rc", "keepalive=0", rcSizes)
	// An idle pause before the first message: Weft's keep-alive probes
	// (zero-length WRITEs with an old PSN) must be acknowledged by rxe as
	// duplicates, without killing the QP that has no remote access.
	steps = append(steps, rxeStep{
		Name:  "rc-pingpong-keepalive",
		Guest: fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g 1 -n %d -s 64", rxeIters),
		Host: func(t *testing.T, ctx context.Context) error {
			return ibvpp.Run(ctx, ibvpp.Config{Backend: "roce", Addr: guestIP + ":18515?dialretry=-1&keepalive=50ms", Size: 64,
				Iters: rxeIters, Client: true, Idle: 1500 * time.Millisecond})
		}})
	steps = append(steps, pingpongSteps("ud", "type=ud", udSizes)...)
	steps = append(steps, weftPingpongSteps()...)
	steps = append(steps, perftestSteps(engineOpts{})...)
	// Last, so that the UDP steps' engines are gone when the XDP link
	// takes the port.
	return append(steps, xdpRxeSteps()...)
}

// weftPingpongSteps run the weft-pingpong command (issue 28) against
// ibv_rc_pingpong in both roles, with keepalive=0: it must see that its
// peer is not Weft and exit with status 0 at the count, as the program
// does, not wait for an answer to a stop message that the program does
// not speak.
func weftPingpongSteps() []rxeStep {
	var steps []rxeStep
	for _, size := range []int{4096, 65536} {
		n := strconv.Itoa(rxeIters)
		steps = append(steps, rxeStep{
			Name:  fmt.Sprintf("weft-pingpong-client-%d", size),
			Guest: fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g 1 -n %d -s %d", rxeIters, size),
			Host: func(t *testing.T, ctx context.Context) error {
				return runWeftPingpong(t, ctx, "-backend", "roce", "-addr", guestIP+":18515?keepalive=0&dialretry=-1",
					"-sizes", strconv.Itoa(size), "-n", n, "-warmup", "0", "-no-ref", "-timeout", "120s")
			}}, rxeStep{
			Name:  fmt.Sprintf("weft-pingpong-server-%d", size),
			Guest: fmt.Sprintf("retry ibv_rc_pingpong -d rxe0 -g 1 -n %d -s %d 10.77.0.1", rxeIters, size),
			Host: func(t *testing.T, ctx context.Context) error {
				return runWeftPingpong(t, ctx, "-server", "-backend", "roce", "-addr", "listen:10.77.0.1:18515?keepalive=0",
					"-n", n, "-timeout", "120s")
			}})
	}
	return steps
}

// runWeftPingpong runs the weft-pingpong binary that TestRxeInterop built
// (WEFT_PINGPONG) with args. It must exit with status 0, and a client
// within 10 s of its last table row: a hang waits for the step's end.
func runWeftPingpong(t *testing.T, ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, os.Getenv("WEFT_PINGPONG"), args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	var out bytes.Buffer
	var last time.Time
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		out.Write(append(lines.Bytes(), '\n'))
		last = time.Now()
	}
	err = cmd.Wait()
	t.Logf("weft-pingpong %s:\n%s%s", strings.Join(args, " "), out.Bytes(), errb.Bytes())
	if err != nil {
		return fmt.Errorf("weft-pingpong: %w", err)
	}
	if !last.IsZero() {
		d := time.Since(last)
		t.Logf("weft-pingpong exited %v after its last row", d.Round(time.Millisecond))
		if d > 10*time.Second {
			return fmt.Errorf("weft-pingpong exited %v after its last row, want within seconds", d)
		}
	}
	return nil
}

// pingpongSteps runs ibv_<qp>_pingpong at every size, first as the server
// against Weft's client, then as the client against Weft's server; params
// are the Weft address's parameters.
func pingpongSteps(qp, params string, sizes []int) []rxeStep {
	var steps []rxeStep
	prog := "ibv_" + qp + "_pingpong"
	for _, s := range sizes {
		steps = append(steps, rxeStep{
			Name:  fmt.Sprintf("%s-pingpong-server-%d", qp, s),
			Guest: fmt.Sprintf("%s -d rxe0 -g 1 -n %d -s %d", prog, rxeIters, s),
			Host: func(t *testing.T, ctx context.Context) error {
				// The guest may still be booting, or finishing the
				// previous step: dial until the step's context ends
				// (the default gives up after 5 s, and a later step
				// would then meet this step's server).
				return weftPingpong(ctx, guestIP+":18515?dialretry=-1&"+params, s, true)
			}})
	}
	for _, s := range sizes {
		steps = append(steps, rxeStep{
			Name:  fmt.Sprintf("%s-pingpong-client-%d", qp, s),
			Guest: fmt.Sprintf("retry %s -d rxe0 -g 1 -n %d -s %d 10.77.0.1", prog, rxeIters, s),
			Host: func(t *testing.T, ctx context.Context) error {
				return weftPingpong(ctx, "listen:10.77.0.1:18515?"+params, s, false)
			}})
	}
	return steps
}

// weftPingpong plays ibv_*_pingpong's protocol with Weft's engine.
func weftPingpong(ctx context.Context, addr string, size int, client bool) error {
	return ibvpp.Run(ctx, ibvpp.Config{Backend: "roce", Addr: addr, Size: size, Iters: rxeIters, Client: client})
}

// TestRxeInterop runs every step: the rdma-core and perftest programs in
// a Soft-RoCE guest, Weft's engine on the host.
func TestRxeInterop(t *testing.T) {
	testenv.RequireRoot(t)
	harness := testenv.RxeHarness(t)
	dir := t.TempDir()
	var gs strings.Builder
	gs.WriteString("#!/bin/sh\n# Generated by roce/rxe_test.go.\nfail=0\n")
	gs.WriteString("retry() { i=0; until \"$@\"; do i=$((i+1)); [ $i -ge 90 ] && return 1; sleep 1; done; }\n")
	for _, s := range rxeSteps() {
		fmt.Fprintf(&gs, "echo '>>> %s'\nif ! %s; then echo 'STEP FAILED: %s'; fail=1; fi\nsleep 1\n", s.Name, s.Guest, s.Name)
	}
	gs.WriteString("sleep 3\nexit $fail\n")
	script := filepath.Join(dir, "guest.sh")
	if err := os.WriteFile(script, []byte(gs.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	// The weft-pingpong steps run the command itself (weftPingpongSteps).
	pingpong := filepath.Join(dir, "weft-pingpong")
	if out, err := exec.Command("go", "build", "-o", pingpong, "../cmd/weft-pingpong").CombinedOutput(); err != nil {
		t.Fatalf("go build weft-pingpong: %v\n%s", err, out)
	}
	pcap := filepath.Join(dir, "rxe.pcap")
	if p := os.Getenv("WEFT_RXE_PCAP"); p != "" {
		pcap = p
	}
	cmd := exec.Command(filepath.Join(harness, "run.sh"), "-n", "1", "-t", "900", "-c", pcap, script,
		os.Args[0], "-test.run=^TestRxeHost$", "-test.v", "-test.timeout=15m")
	cmd.Env = append(os.Environ(), "WEFT_RXE_HOST=1", "WEFT_PINGPONG="+pingpong)
	out, err := cmd.CombinedOutput()
	t.Logf("harness output:\n%s", out)
	if err != nil {
		t.Fatalf("interop failed: %v (capture in %s)", err, pcap)
	}
	if bytes.Contains(out, []byte("STEP FAILED")) || !bytes.Contains(out, []byte("--- PASS: TestRxeHost")) {
		t.Fatalf("interop failed (capture in %s)", pcap)
	}
}

// TestRxeHost is the host side, run by the harness in its namespace.
func TestRxeHost(t *testing.T) {
	if os.Getenv("WEFT_RXE_HOST") != "1" {
		t.Skip("run by TestRxeInterop inside the harness")
	}
	var xdp xdpHold
	defer xdp.release()
	for _, s := range rxeSteps() {
		xdp.set(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		start := time.Now()
		before := xdp.stats()
		err := s.Host(t, ctx)
		cancel()
		if s.XDP {
			err = xdp.check(t, s.Name, before, err)
		}
		if err != nil {
			t.Errorf("step %s: %v", s.Name, err)
		} else {
			t.Logf("step %s: ok in %v", s.Name, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

type perftestCase struct {
	kind        string // send_lat, write_bw, read_lat
	prog        string
	size, iters int
}

var perftestCases = []perftestCase{
	{"send_lat", "ib_send_lat", 2, 100},
	{"send_lat", "ib_send_lat", 4096, 20},
	{"write_bw", "ib_write_bw", 65536, 20},
	{"read_lat", "ib_read_lat", 2, 50},
	{"read_lat", "ib_read_lat", 4096, 20},
}

// perftestSteps runs every perftestCases entry in both roles, with the
// engine configured by opts.
func perftestSteps(opts engineOpts) []rxeStep {
	return perftestStepsOf(perftestCases, opts)
}

func perftestStepsOf(cases []perftestCase, opts engineOpts) []rxeStep {
	var steps []rxeStep
	for _, c := range cases {
		args := fmt.Sprintf("%s -d rxe0 -s %d -n %d", c.prog, c.size, c.iters)
		steps = append(steps,
			rxeStep{Name: fmt.Sprintf("%s-server-%d", c.prog, c.size), Guest: args,
				Host: func(t *testing.T, ctx context.Context) error { return weftPerftest(ctx, c, true, opts) }},
			rxeStep{Name: fmt.Sprintf("%s-client-%d", c.prog, c.size), Guest: "retry " + args + " 10.77.0.1",
				Host: func(t *testing.T, ctx context.Context) error { return weftPerftest(ctx, c, false, opts) }})
	}
	return steps
}

// weftPerftest plays the other side of a perftest program: its TCP
// protocol (INTEROP.md section 3) and its traffic, with the engine
// configured by opts.
func weftPerftest(ctx context.Context, c perftestCase, client bool, opts engineOpts) error {
	var conn net.Conn
	var err error
	if client {
		d := net.Dialer{}
		for {
			conn, err = d.DialContext(ctx, "tcp", guestIP+":18515")
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	} else {
		var ln net.Listener
		ln, err = net.Listen("tcp", "10.77.0.1:18515")
		if err == nil {
			stop := context.AfterFunc(ctx, func() { ln.Close() })
			conn, err = ln.Accept()
			stop()
			ln.Close()
		}
	}
	if err != nil {
		return err
	}
	pc := exchange.NewPerftestConn(conn, client)
	defer pc.Close()
	if err := pc.Preamble(ctx, 1024); err != nil {
		return err
	}
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	eng, release, err := acquireEngine(netip.AddrPortFrom(local, link.Port), opts)
	if err != nil {
		return err
	}
	defer release()
	pd := eng.AllocPD()
	qp, err := pd.CreateQP(QPConfig{})
	if err != nil {
		return err
	}
	defer qp.Destroy()
	bufSize := 2 * max(c.size, 4096)
	mr, err := pd.RegMR(make([]byte, bufSize), fabric.AccessLocalWrite|fabric.AccessRemoteWrite|fabric.AccessRemoteRead)
	if err != nil {
		return err
	}
	outReads := uint16(1)
	if c.kind == "read_lat" {
		outReads = 16
	}
	mine := exchange.PerftestKeys{OutReads: outReads, QPN: qp.QPN(), PSN: wire.PSN(time.Now().UnixNano()) & wire.PSNMask,
		RKey: uint32(mr.RemoteKey()), VA: mr.Addr() + uint64(bufSize/2), GID: eng.GID()}
	peer, err := pc.HandShake(ctx, mine) // H1
	if err != nil {
		return err
	}
	attr := &QPAttr{PathMTU: pc.MTU, Dest: peer.GID.Addr(), DestQPN: peer.QPN, RQPSN: peer.PSN, SQPSN: mine.PSN,
		Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRDAtomic: max(1, int(peer.OutReads))}
	if err := qp.Connect(attr); err != nil {
		return err
	}
	for i := 0; i < 3; i++ { // H2, H3, H4 (write_bw's H4 comes after the traffic)
		if c.kind == "write_bw" && i == 2 {
			break
		}
		if _, err := pc.HandShake(ctx, mine); err != nil {
			return err
		}
	}
	one := func(op string, m fabric.Message) error {
		m.Flags |= fabric.FlagSignal
		var err error
		switch op {
		case "send":
			_, err = qp.SendWait(ctx, []fabric.Message{m})
		case "write":
			_, err = qp.postWait(ctx, []fabric.Message{m}, qp.Write)
		case "read":
			_, err = qp.postWait(ctx, []fabric.Message{m}, qp.Read)
		}
		if err != nil {
			return err
		}
		out := make([]fabric.Completion, 1)
		if _, err := qp.cq.Wait(ctx, out); err != nil {
			return err
		}
		return out[0].Err()
	}
	src := fabric.SGE{Region: mr, Length: c.size}
	recvOne := func() error {
		msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: mr, Offset: bufSize / 2, Length: c.size}}}}
		if _, err := qp.RecvWait(ctx, msgs); err != nil {
			return err
		}
		if msgs[0].Len != c.size {
			return fmt.Errorf("received %d bytes, want %d", msgs[0].Len, c.size)
		}
		return nil
	}
	remote := fabric.RemoteIOV{Addr: peer.VA, Len: uint64(c.size), Key: fabric.Key(peer.RKey)}
	switch c.kind {
	case "send_lat":
		for i := 0; i < c.iters; i++ {
			if client {
				if err := one("send", fabric.Message{SGEs: []fabric.SGE{src}}); err != nil {
					return fmt.Errorf("send %d: %w", i, err)
				}
				if err := recvOne(); err != nil {
					return fmt.Errorf("receive %d: %w", i, err)
				}
			} else {
				if err := recvOne(); err != nil {
					return fmt.Errorf("receive %d: %w", i, err)
				}
				if err := one("send", fabric.Message{SGEs: []fabric.SGE{src}}); err != nil {
					return fmt.Errorf("send %d: %w", i, err)
				}
			}
		}
	case "write_bw":
		start := time.Now()
		if client {
			for i := 0; i < c.iters; i++ {
				if err := one("write", fabric.Message{SGEs: []fabric.SGE{src}, Remote: remote}); err != nil {
					return fmt.Errorf("write %d: %w", i, err)
				}
			}
		}
		if _, err := pc.HandShake(ctx, mine); err != nil { // H4
			return err
		}
		if !client {
			if !bytes.ContainsFunc(mr.Bytes()[bufSize/2:bufSize/2+c.size], func(r rune) bool { return r != 0 }) {
				return fmt.Errorf("the client's writes left the buffer zero")
			}
		}
		// The bandwidth report: size, iterations, then peak and average
		// MB/s and Mmsg/s as big-endian doubles. perftest does not check
		// the server's, which it never fills.
		secs := time.Since(start).Seconds()
		mbs := float64(c.size) * float64(c.iters) / secs / 1e6
		report := []uint64{uint64(c.size), uint64(c.iters), math.Float64bits(mbs), math.Float64bits(mbs),
			math.Float64bits(float64(c.iters) / secs / 1e6)}
		for i := 0; i < 5; i++ {
			v := uint64(0)
			if client {
				v = report[i]
			}
			if _, err := pc.Exchange8(ctx, v); err != nil {
				return err
			}
		}
	case "read_lat":
		if client {
			dst := fabric.SGE{Region: mr, Offset: bufSize / 2, Length: c.size}
			for i := 0; i < c.iters; i++ {
				if err := one("read", fabric.Message{SGEs: []fabric.SGE{dst}, Remote: remote}); err != nil {
					return fmt.Errorf("read %d: %w", i, err)
				}
			}
		}
	}
	if _, err := pc.HandShake(ctx, mine); err != nil { // H5
		return err
	}
	return nil
}
