package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce"
	"github.com/weft-io/weft/roce/exchange"
)

// build builds the command into the test's temporary directory and
// returns its path.
func build(t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "weft-pingpong")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return exe
}

// TestBothEnds runs the README's main job, shortened, on both backends
// that can run both ends here: the table comes out and both processes
// end with status 0 (the server answers the client's stop message).
func TestBothEnds(t *testing.T) {
	exe := build(t)
	for _, backend := range []string{"ntb", "roce"} {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, exe, "-backend", backend, "-sizes", "8,4096", "-n", "200", "-warmup", "20", "-ref-n", "2000").CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, want := range []string{"#bytes", "\n8 ", "\n4096 "} {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if backend == "ntb" && !strings.Contains(string(out), "reference round trip median") {
				t.Errorf("output lacks the shared-memory reference:\n%s", out)
			}
		})
	}
}

// TestNoPeer checks that a client with nothing to connect to says what
// it waits for and gives up after -timeout with status 1.
func TestNoPeer(t *testing.T) {
	exe := build(t)
	start := time.Now()
	out, err := exec.Command(exe, "-backend", "roce", "-addr", "127.0.0.1:1", "-timeout", "1s").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("gave up after %v with -timeout 1s", el)
	}
	for _, want := range []string{"waiting for a server at roce 127.0.0.1:1", "no peer at roce 127.0.0.1:1 within 1s"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestListenMany: one -server -listen process serves several client
// processes at once over the RoCE engine (each client on an address of
// its own), and ends after them with status 0.
func TestListenMany(t *testing.T) {
	exe := build(t)
	const clients = 3
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, exe, "-server", "-listen", "-clients", strconv.Itoa(clients), "-backend", "roce", "-addr", "127.0.0.1:0")
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	addr := ""
	for addr == "" && lines.Scan() {
		_, addr, _ = strings.Cut(lines.Text(), "listening at roce ")
	}
	if addr == "" {
		t.Fatal("the server never said where it listens")
	}
	drained := make(chan struct{})
	go func() { io.Copy(io.Discard, stderr); close(drained) }()
	outs := make(chan string, clients)
	for i := range clients {
		go func() {
			out, err := exec.CommandContext(ctx, exe, "-backend", "roce", "-addr", fmt.Sprintf("%s?local=127.0.0.%d", addr, 2+i),
				"-sizes", "8,4096", "-n", "200", "-warmup", "20").CombinedOutput()
			if err != nil {
				out = append(out, []byte("\nexit: "+err.Error())...)
			}
			outs <- string(out)
		}()
	}
	for range clients {
		if out := testenv.Recv(t, outs, "the clients' output"); !strings.Contains(out, "\n4096 ") || strings.Contains(out, "exit:") {
			t.Errorf("client:\n%s", out)
		}
	}
	testenv.Recv(t, drained, "the end of the server's stderr (its exit)")
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v", err)
	}
}

// foreignPeer plays ibv_rc_pingpong (not Weft: its exchange carries LID
// 0) on a RoCE engine of its own at 127.0.0.9: the exchange on conn, as
// the client or the server, then iters messages of size each way, the
// client first. It returns once its last message is acknowledged, and
// leaves its queue pair to the caller, as the program's exit would.
func foreignPeer(ctx context.Context, t *testing.T, conn net.Conn, client bool, size, iters int) (*roce.QP, error) {
	e, err := roce.NewEngine(roce.EngineConfig{Addr: netip.MustParseAddrPort("127.0.0.9:4791")})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { e.Close() })
	pd := e.AllocPD()
	qp, err := pd.CreateQP(roce.QPConfig{MaxMsgSize: size})
	if err != nil {
		return nil, err
	}
	buf, err := pd.RegMR(make([]byte, size), fabric.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	mine := exchange.Dest{QPN: qp.QPN(), PSN: 77, GID: e.GID()} // LID 0, as on any RoCE port
	connect := func(peer exchange.Dest) error {
		return qp.Connect(&roce.QPAttr{PathMTU: 1024, Dest: peer.GID.Addr(), DestQPN: peer.QPN, RQPSN: peer.PSN,
			SQPSN: mine.PSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRDAtomic: 1})
	}
	if client {
		if _, err := exchange.Client(ctx, conn, mine, connect); err != nil {
			return nil, err
		}
	} else if _, err := exchange.Server(ctx, conn, mine, connect); err != nil {
		return nil, err
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: size}}, Flags: fabric.FlagSignal}}
	send := func() error {
		msgs[0].SGEs[0].Length = size
		_, err := qp.SendWait(ctx, msgs)
		return err
	}
	recv := func() error {
		msgs[0].SGEs[0].Length = size
		if _, err := qp.RecvWait(ctx, msgs); err != nil {
			return err
		}
		if msgs[0].Len != size {
			return fmt.Errorf("got %d bytes, want %d", msgs[0].Len, size)
		}
		return nil
	}
	for range iters {
		steps := []func() error{recv, send}
		if client {
			steps = []func() error{send, recv}
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return nil, err
			}
		}
	}
	return qp, nil
}

// TestForeignPeer: against a peer that is not Weft (ibv_rc_pingpong's
// exchange and messages, played by a bare queue pair), weft-pingpong
// runs as that program does in either role: exactly -n messages each way
// of one size, no stop message, and exit status 0 at the count, while
// the peer's queue pair, like the exited program's, answers nothing
// more.
func TestForeignPeer(t *testing.T) {
	exe := build(t)
	const size, iters = 4096, 50
	for _, role := range []string{"client", "server"} {
		t.Run(role, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var args []string
			if role == "client" { // weft-pingpong is the client: the peer serves
				args = []string{"-backend", "roce", "-addr", ln.Addr().String() + "?keepalive=0&local=127.0.0.1",
					"-sizes", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-warmup", "0", "-no-ref"}
			} else {
				port := ln.Addr().(*net.TCPAddr).Port
				ln.Close() // weft-pingpong listens there
				args = []string{"-server", "-backend", "roce", "-addr", fmt.Sprintf("listen:127.0.0.1:%d?keepalive=0", port),
					"-n", strconv.Itoa(iters)}
			}
			cmd := exec.CommandContext(ctx, exe, args...)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			var conn net.Conn
			if role == "client" {
				ln.(*net.TCPListener).SetDeadline(testenv.Deadline())
				conn, err = ln.Accept()
			} else {
				d := net.Dialer{Timeout: time.Second}
				for conn, err = d.DialContext(ctx, "tcp", ln.Addr().String()); err != nil && ctx.Err() == nil; conn, err = d.DialContext(ctx, "tcp", ln.Addr().String()) {
					time.Sleep(20 * time.Millisecond) // until it listens
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			qp, err := foreignPeer(ctx, t, conn, role == "server", size, iters)
			conn.Close()
			if err != nil {
				t.Fatalf("peer: %v\n%s", err, out.String())
			}
			qp.Destroy() // the program exits: nothing answers any more
			if err := testenv.Recv(t, exited, "weft-pingpong's exit"); err != nil {
				t.Fatalf("weft-pingpong: %v\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), "is not Weft") {
				t.Errorf("weft-pingpong did not say the peer is not Weft:\n%s", out.String())
			}
			if role == "client" && !strings.Contains(out.String(), fmt.Sprintf("\n%-10d %-12d", size, iters)) {
				t.Errorf("no row of %d iterations of %d B:\n%s", iters, size, out.String())
			}
		})
	}
}

// TestStopUnanswered: a Weft server that goes silent after the last
// echo (here it never answers the stop message, and keepalive=0 reports
// nothing) does not hang the client: it gives up after stopReplyTime
// with status 1 and says why.
func TestStopUnanswered(t *testing.T) {
	exe := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second) // the bound is 5 s
	defer cancel()
	l, err := fabric.Listen(ctx, "roce", "127.0.0.1:0?keepalive=0&local=127.0.0.10", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const iters = 20
	cmd := exec.CommandContext(ctx, exe, "-backend", "roce", "-addr", l.Addr(), "-sizes", "64", "-n", strconv.Itoa(iters), "-warmup", "0", "-no-ref")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ep, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	buf, err := ep.Alloc(64, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
	for range iters + 1 { // the echoes, then the stop message, unanswered
		msgs[0].SGEs[0].Length = 64
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		if msgs[0].Flags&fabric.FlagImm != 0 {
			break
		}
		msgs[0].SGEs[0].Length = msgs[0].Len
		if _, err := ep.SendWait(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	err = <-exited
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "no answer to the stop message within 5s") {
		t.Errorf("output does not say why:\n%s", out.String())
	}
}
