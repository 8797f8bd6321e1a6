package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/ntb"
	"github.com/weft-io/weft/observe"
)

// The helper process is a pingpong-like program that exposes its two
// endpoints (both ends of an emulated ntb bridge) through package
// observe, and takes commands on stdin: "down" and "up" take the server
// side's link down and up.
func TestMain(m *testing.M) {
	if os.Getenv("WEFT_TEST_PINGPONG") != "" {
		if err := pingpongProgram(os.Getenv("WEFT_TEST_PINGPONG")); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func pingpongProgram(path string) error {
	ctx := context.Background()
	type side struct {
		tr  *ntb.Transport
		err error
	}
	ch := make(chan side, 2)
	for range 2 {
		go func() {
			dev, err := ntb.OpenShm(path, ntb.ShmConfig{})
			if err != nil {
				ch <- side{err: err}
				return
			}
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			tr, err := ntb.Dial(dctx, dev, ntb.Config{})
			ch <- side{tr, err}
		}()
	}
	a, b := <-ch, <-ch
	if a.err != nil || b.err != nil {
		return fmt.Errorf("dial: %v, %v", a.err, b.err)
	}
	defer a.tr.Close()
	defer b.tr.Close()
	cli, _ := a.tr.Endpoint(0)
	srv, _ := b.tr.Endpoint(0)
	reg := observe.NewRegistry("pingpong")
	if err := reg.AddEndpoint("pingpong/client", cli, true); err != nil {
		return err
	}
	if err := reg.AddEndpoint("pingpong/server", srv, true); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go http.Serve(ln, reg.Handler())
	fmt.Printf("URL http://%s\n", ln.Addr())
	go func() { // server: echo
		buf, _ := srv.Alloc(4096, fabric.AccessLocalWrite)
		m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
		for {
			m[0].SGEs[0].Length = 4096
			if _, err := srv.RecvWait(ctx, m); err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			m[0].SGEs[0].Length, m[0].Flags = m[0].Len, 0
			srv.SendWait(ctx, m)
		}
	}()
	go func() { // client: one ping a millisecond
		buf, _ := cli.Alloc(4096, fabric.AccessLocalWrite)
		m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
		for {
			m[0].SGEs[0].Length, m[0].Flags = 64, 0
			if _, err := cli.SendWait(ctx, m); err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			m[0].SGEs[0].Length = 4096
			rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			cli.RecvWait(rctx, m)
			cancel()
			time.Sleep(time.Millisecond)
		}
	}()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "down":
			err = b.tr.Device().LinkDisable()
		case "up":
			err = b.tr.Device().LinkEnable()
		default:
			err = fmt.Errorf("unknown command %q", sc.Text())
		}
		fmt.Printf("done %s %v\n", sc.Text(), err)
	}
	return nil
}

// program is a running helper.
type program struct {
	url   string
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startProgram(t *testing.T) *program {
	t.Helper()
	path := filepath.Join(os.TempDir(), fmt.Sprintf("weft-cmd-test-%d", os.Getpid()))
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		path = filepath.Join("/dev/shm", filepath.Base(path))
	}
	os.Remove(path)
	t.Cleanup(func() {
		// After the helper is killed (cleanups run last first): the
		// bridge's file and the bell pipes beside it, which a killed
		// owner cannot remove.
		os.Remove(path)
		bells, _ := filepath.Glob(path + ".bell*")
		for _, b := range bells {
			os.Remove(b)
		}
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "WEFT_TEST_PINGPONG="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	p := &program{stdin: stdin, out: bufio.NewScanner(stdout)}
	var ok bool
	testenv.Await(t, "the helper's URL", func() { ok = p.out.Scan() })
	if !ok || !strings.HasPrefix(p.out.Text(), "URL ") {
		t.Fatalf("helper did not start: %q", p.out.Text())
	}
	p.url = strings.TrimPrefix(p.out.Text(), "URL ")
	return p
}

func (p *program) do(t *testing.T, cmd string) {
	t.Helper()
	fmt.Fprintln(p.stdin, cmd)
	var ok bool
	testenv.Await(t, "the helper's answer to "+cmd, func() { ok = p.out.Scan() })
	if !ok || p.out.Text() != "done "+cmd+" <nil>" {
		t.Fatalf("%s: helper said %q", cmd, p.out.Text())
	}
}

func runStatus(t *testing.T, url string) string {
	t.Helper()
	var b bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := status(ctx, &b, []string{"-addr", url}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// lineWriter collects lines and the time each arrived.
type lineWriter struct {
	mu    sync.Mutex
	buf   []byte
	lines []string
	at    []time.Time
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.lines = append(w.lines, string(w.buf[:i]))
		w.at = append(w.at, time.Now())
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// find returns when the first line containing every one of subs arrived.
func (w *lineWriter) find(subs ...string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
next:
	for i, l := range w.lines {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		return w.at[i], true
	}
	return time.Time{}, false
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStatusWatch runs weft status and weft watch against a running
// pingpong program, flaps its link and checks what they print.
func TestStatusWatch(t *testing.T) {
	p := startProgram(t)

	// status: both endpoints, up, with traffic counted.
	var out string
	waitFor(t, 30*time.Second, func() bool {
		out = runStatus(t, p.url)
		return strings.Contains(out, "rx_messages=") && strings.Count(out, "tx_messages=") == 2
	})
	t.Logf("weft status:\n%s", out)
	for _, want := range []string{"program pingpong", "pingpong/client", "pingpong/server", "endpoint", "ntb", "NAME", "STATE"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "pingpong/") && strings.Contains(l, "endpoint") && !strings.Contains(l, " up ") {
			t.Errorf("endpoint not up: %q", l)
		}
	}

	// watch: a flap shows as link-down then link-up of both ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var w lineWriter
	done := make(chan error, 1)
	go func() { done <- watch(ctx, &w, []string{"-addr", p.url, "-n", "4"}) }()
	waitFor(t, 10*time.Second, func() bool { _, ok := w.find("watching"); return ok })
	downAt := time.Now()
	p.do(t, "down")
	waitFor(t, 10*time.Second, func() bool {
		_, a := w.find("pingpong/client", "link-down")
		_, b := w.find("pingpong/server", "link-down")
		return a && b
	})
	seen, _ := w.find("link-down")
	t.Logf("link-down printed by weft watch %v after the link was disabled", seen.Sub(downAt))
	// The issue asks for 100 ms; the long poll takes about a millisecond
	// (the ntb link poll is 2 ms). The bound here is loose so that a
	// loaded machine's scheduling cannot fail the test; a watcher that
	// polled on a period would still miss it.
	if d := seen.Sub(downAt); d > 2*time.Second {
		t.Errorf("link-down took %v to reach weft watch", d)
	}
	out = runStatus(t, p.url)
	if !strings.Contains(out, "down") {
		t.Errorf("status during the flap does not say down:\n%s", out)
	}
	upAt := time.Now()
	p.do(t, "up")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("watch did not see 4 events:\n%s", w.String())
	}
	t.Logf("weft watch:\n%s", w.String())
	up, ok1 := w.find("pingpong/client", "link-up")
	_, ok2 := w.find("pingpong/server", "link-up")
	if !ok1 || !ok2 {
		t.Fatalf("no link-up of both ends:\n%s", w.String())
	}
	if dn, _ := w.find("pingpong/client", "link-down"); !dn.Before(up) && !dn.Equal(up) {
		t.Errorf("link-up printed before link-down:\n%s", w.String())
	}
	t.Logf("link-up printed %v after the link was enabled (handshake included)", up.Sub(upAt))
	waitFor(t, 30*time.Second, func() bool {
		out = runStatus(t, p.url)
		return strings.Count(out, " up ") >= 2
	})
	if !strings.Contains(out, "link-down") || !strings.Contains(out, "link-up") {
		t.Errorf("status's recent events lack the flap:\n%s", out)
	}
}

// TestPingPerf runs weft ping and weft perf against their servers over
// an emulated ntb bridge.
func TestPingPerf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	for _, c := range []struct {
		name string
		fn   func(context.Context, io.Writer, []string) error
		args []string
		want string
	}{
		{"ping", ping, []string{"-c", "200", "-size", "64"}, "200 round trips of 64 bytes"},
		{"perf", perf, []string{"-t", "300ms", "-size", "8192"}, "Gbit/s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(path)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srvErr := make(chan error, 1)
			var srvOut bytes.Buffer
			go func() { srvErr <- c.fn(ctx, &srvOut, []string{"-server", path}) }()
			var out bytes.Buffer
			if err := c.fn(ctx, &out, append(c.args, path)); err != nil {
				t.Fatal(err)
			}
			if err := testenv.Recv(t, srvErr, "the server"); err != nil {
				t.Fatalf("server: %v", err)
			}
			t.Logf("%s%s", out.String(), srvOut.String())
			if !strings.Contains(out.String(), c.want) {
				t.Errorf("output lacks %q", c.want)
			}
			if c.name == "perf" && strings.Contains(out.String(), "received 0 bytes") {
				t.Error("server received nothing")
			}
		})
	}
}
