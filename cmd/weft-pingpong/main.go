// Command weft-pingpong measures message latency over a Weft backend, in
// the style of perftest's ib_send_lat. It is the measuring tool behind
// the README's main job; examples/pingpong is the same exchange cut down
// to what a program copies.
//
// With no arguments it runs both ends itself: it starts a second process
// of itself as the server, connects the two over an emulated NTB bridge in
// /dev/shm, and prints a latency table for sizes 8 B to 64 KiB, beside the
// floor for any cross-process message: a plain shared-memory spin
// ping-pong measured in the same run.
//
//	go run ./cmd/weft-pingpong
//
// With flags it runs one side on any registered backend:
//
//	weft-pingpong -server -backend ntb -addr /dev/shm/weft0   # one process
//	weft-pingpong -server -listen -backend roce -addr 10.0.0.1:18515 # any number of clients
//	weft-pingpong -backend ntb -addr /dev/shm/weft0           # the other
//
// Each side says what it waits for and gives up after -timeout (30s) if
// the peer does not come. At the end the client sends a stop message and
// waits for the server's reply (at most 5 s) before it closes, so both
// exit with status 0.
//
// Over roce and verbs the pingpong exchange interoperates with
// rdma-core's ibv_rc_pingpong, and tells it from a Weft peer
// (fabric.Caps.Foreign). Against it, either side runs as
// ibv_rc_pingpong does: one size (-sizes, its -s), exactly -n messages
// each way (its -n; the first -warmup of them, at most half, are not
// measured), no stop message, and an exit at the count:
//
//	ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 200            # on the peer
//	weft-pingpong -backend roce -addr 'PEER:18515' -sizes 4096 -n 200 -warmup 0 -no-ref
//
// "-backend roce" with no address runs both ends as well, over two
// user-space RoCEv2 engines on loopback (127.0.0.1 and 127.0.0.2), which
// meet through shared memory by default (link=auto: the header says
// roce/shm); "-link udp" keeps them on UDP.
//
// Latencies are one-way, half the round trip, as perftest reports them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	_ "github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shmref"
	"github.com/weft-io/weft/internal/stats"
	_ "github.com/weft-io/weft/ntb"
	_ "github.com/weft-io/weft/roce"
	_ "github.com/weft-io/weft/roce/verbs"
)

const stopImm = 0x5707

func main() {
	backend := flag.String("backend", "ntb", "backend: "+strings.Join(fabric.Backends(), ", "))
	addr := flag.String("addr", "", "address (see -help-addr); empty with no other flags: run both ends")
	server := flag.Bool("server", false, "run the echoing side")
	listen := flag.Bool("listen", false, "with -server: listen at -addr (fabric.Listen) and serve any number of clients at once")
	clients := flag.Int("clients", 0, "with -listen: exit after serving this many clients (0: serve until killed)")
	sizesFlag := flag.String("sizes", "8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768,65536", "message sizes in bytes")
	iters := flag.Int("n", 10000, "iterations per size (fewer for large sizes); against ibv_rc_pingpong, its -n: every message, warm-up included")
	warmup := flag.Int("warmup", 1000, "warm-up iterations per size")
	refIters := flag.Int("ref-n", 100000, "iterations of the shared-memory reference")
	noRef := flag.Bool("no-ref", false, "skip the shared-memory reference")
	refServe := flag.String("shmref-serve", "", "internal: run the reference responder on this file")
	helpAddr := flag.Bool("help-addr", false, "print the address syntax of every backend")
	spin := flag.Duration("spin", time.Millisecond, "how long blocking calls busy-poll before they sleep (0: the backend default)")
	timeout := flag.Duration("timeout", 30*time.Second, "how long to wait for the peer to connect (0: forever)")
	linkFlag := flag.String("link", "auto", "with -backend roce and no -addr: the engines' link (auto, udp, shm; see go doc roce)")
	flag.Parse()
	if *helpAddr {
		for _, b := range fabric.Backends() {
			u, _ := fabric.Usage(b)
			fmt.Printf("%s: %s\n", b, u)
		}
		return
	}
	if *refServe != "" {
		runtime.LockOSThread()
		if err := shmref.Serve(*refServe); err != nil {
			fatal(err)
		}
		return
	}
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		fatal(err)
	}
	opts := &fabric.Options{MaxMsgSize: max(64<<10, slicesMax(sizes)), Spin: *spin}
	ctx := context.Background()
	if *addr == "" {
		if *server {
			fatal(fmt.Errorf("-server needs -addr"))
		}
		if err := runBoth(ctx, *backend, *linkFlag, opts, sizes, *iters, *warmup, *refIters, *noRef, *timeout); err != nil {
			fatal(err)
		}
		return
	}
	if *listen {
		if !*server {
			fatal(fmt.Errorf("-listen needs -server"))
		}
		if err := serveMany(ctx, *backend, *addr, opts, *clients, *iters); err != nil {
			fatal(err)
		}
		return
	}
	who := "a server at"
	if *server {
		who = "a client on"
	}
	fmt.Fprintf(os.Stderr, "pingpong: waiting for %s %s %s (-timeout %v)\n", who, *backend, *addr, *timeout)
	ep, err := open(ctx, *backend, *addr, opts, *timeout)
	if err != nil {
		fatal(err)
	}
	defer ep.Close()
	if *server {
		err = serve(ctx, ep, *iters)
	} else {
		err = client(ctx, ep, sizes, *iters, *warmup)
	}
	if err != nil {
		fatal(err)
	}
}

// open opens an endpoint, giving up after timeout (0: never) with an
// error that says what it waited for.
func open(ctx context.Context, backend, addr string, opts *fabric.Options, timeout time.Duration) (fabric.Endpoint, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	ep, err := fabric.Open(ctx, backend, addr, opts)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("no peer at %s %s within %v: %w", backend, addr, timeout, err)
	}
	return ep, err
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "pingpong:", err)
	os.Exit(1)
}

func slicesMax(s []int) int {
	m := 0
	for _, v := range s {
		m = max(m, v)
	}
	return m
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad size %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func shmDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// runBoth starts a server process of this binary and runs the client.
func runBoth(ctx context.Context, backend, lk string, opts *fabric.Options, sizes []int, iters, warmup, refIters int, noRef bool, timeout time.Duration) error {
	if backend != "ntb" && backend != "roce" {
		return fmt.Errorf("running both ends needs -backend ntb or roce; for %s start a -server and a client with -addr", backend)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var ref *stats.Summary
	if !noRef && backend == "ntb" {
		path := filepath.Join(shmDir(), fmt.Sprintf("weft-shmref-%d", os.Getpid()))
		defer os.Remove(path)
		var cmd *exec.Cmd
		rtt, err := shmref.Ping(path, refIters, refIters/10, func() error {
			cmd = exec.Command(self, "-shmref-serve", path)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			return cmd.Start()
		})
		if cmd != nil {
			defer cmd.Wait()
		}
		if err != nil {
			return err
		}
		s := stats.Summarize(rtt)
		ref = &s
	}
	path := filepath.Join(shmDir(), fmt.Sprintf("weft-pingpong-%d", os.Getpid()))
	serverAddr, clientAddr := path, path
	if backend == "roce" {
		// Two user-space RoCE engines over loopback: the server on
		// 127.0.0.1, the client on 127.0.0.2, path MTU 4096.
		port := 18515 + os.Getpid()%1000
		serverAddr = fmt.Sprintf("listen:127.0.0.1:%d?mtu=4096&raw=0&link=%s", port, url.QueryEscape(lk))
		clientAddr = fmt.Sprintf("127.0.0.1:%d?local=127.0.0.2&mtu=4096&raw=0&link=%s", port, url.QueryEscape(lk))
	} else {
		os.Remove(path)
		defer os.Remove(path)
	}
	cmd := exec.Command(self, "-server", "-backend", backend, "-addr", serverAddr, "-spin", opts.Spin.String(),
		"-timeout", timeout.String())
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Wait()
	ep, err := open(ctx, backend, clientAddr, opts, timeout)
	if err != nil {
		cmd.Process.Kill()
		return err
	}
	defer ep.Close()
	if p := ep.Caps().Path; p != "" {
		backend += "/" + p // the carrier the connection took (roce: link=auto's choice)
	}
	fmt.Printf("Weft pingpong: backend %s (%s), client pid %d, server pid %d, GOMAXPROCS %d\n",
		backend, clientAddr, os.Getpid(), cmd.Process.Pid, runtime.GOMAXPROCS(0))
	if ref != nil {
		fmt.Printf("reference: plain shared-memory spin ping-pong between two processes, %d round trips:\n", ref.N)
		fmt.Printf("  one-way min %.3f  median %.3f  p99 %.3f  max %.3f usec (round trip median %d ns)\n\n",
			us(ref.Min/2), us(ref.Median/2), us(ref.P99/2), us(ref.Max/2), ref.Median.Nanoseconds())
	}
	if err := client(context.Background(), ep, sizes, iters, warmup); err != nil {
		return err
	}
	if ref != nil {
		fmt.Printf("\nreference round trip median: %d ns\n", ref.Median.Nanoseconds())
	}
	if err := cmd.Wait(); err != nil { // the server ends once it has answered the stop
		return fmt.Errorf("server (pid %d): %w", cmd.Process.Pid, err)
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// serveMany listens at addr and serves every client that connects in a
// goroutine of its own, until count clients have been served (0: never).
func serveMany(ctx context.Context, backend, addr string, opts *fabric.Options, count, iters int) error {
	l, err := fabric.Listen(ctx, backend, addr, opts)
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(os.Stderr, "pingpong: listening at %s %s\n", backend, l.Addr())
	errs := make(chan error, max(count, 0))
	for n := 0; count == 0 || n < count; n++ {
		ep, err := l.Accept(ctx)
		if err != nil {
			return err
		}
		go func() {
			defer ep.Close()
			err := serve(ctx, ep, iters)
			if err != nil {
				err = fmt.Errorf("client %s: %w", ep.RemoteAddr(), err)
				fmt.Fprintln(os.Stderr, "pingpong:", err)
			}
			if count > 0 {
				errs <- err
			}
		}()
	}
	var first error
	for range count {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// serve echoes every message until the client's stop message, which it
// answers before it returns, or the client going away. A foreign client
// (ibv_rc_pingpong) sends no stop message: serve echoes iters messages
// to it, as ibv_rc_pingpong's server does with -n, and returns.
func serve(ctx context.Context, ep fabric.Endpoint, iters int) error {
	buf, err := ep.Alloc(ep.Caps().MaxMsgSize, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	foreign := ep.Caps().Foreign
	if foreign {
		fmt.Fprintf(os.Stderr, "pingpong: the client is not Weft (ibv_rc_pingpong?): echoing -n %d messages, then exiting\n", iters)
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
	for i := 0; !foreign || i < iters; i++ {
		msgs[0].SGEs[0].Length = buf.Len()
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			if errors.Is(err, fabric.ErrPeerGone) {
				return nil
			}
			return err
		}
		if !foreign && msgs[0].Flags&fabric.FlagImm != 0 && msgs[0].Imm == stopImm {
			msgs[0].SGEs[0].Length = 1
			msgs[0].Flags = 0
			_, err := ep.SendWait(ctx, msgs) // the reply tells the client it may close
			return err
		}
		msgs[0].SGEs[0].Length = msgs[0].Len
		msgs[0].Flags = 0
		if _, err := ep.SendWait(ctx, msgs); err != nil {
			return err
		}
	}
	return nil
}

// stopReplyTime bounds the client's wait for the server's answer to the
// stop message: a server that has gone must not hang the client, even
// where nothing reports its loss (keepalive=0).
const stopReplyTime = 5 * time.Second

// client runs the ping-pong for every size and prints the table. Against
// a foreign server (ibv_rc_pingpong) it runs as that program's client
// does: one size, exactly iters messages each way (the first warmup of
// them, at most half, not measured), and no stop message.
func client(ctx context.Context, ep fabric.Endpoint, sizes []int, iters, warmup int) error {
	caps := ep.Caps()
	if caps.Foreign {
		if len(sizes) != 1 {
			return fmt.Errorf("the server is not Weft (ibv_rc_pingpong?) and runs one size: give -sizes one size, its -s")
		}
		warmup = min(warmup, iters/2)
		fmt.Fprintf(os.Stderr, "pingpong: the server is not Weft (ibv_rc_pingpong?): -n %d messages each way, the first %d not measured, and no stop message\n", iters, warmup)
	}
	buf, err := ep.Alloc(caps.MaxMsgSize, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	for i := range buf.Bytes() {
		buf.Bytes()[i] = byte(i)
	}
	fmt.Printf("%-10s %-12s %-12s %-12s %-12s %-12s\n", "#bytes", "#iterations", "t_min[usec]", "t_median", "t_p99", "t_max")
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf}}}}
	rtt := make([]time.Duration, 0, iters)
	for _, size := range sizes {
		if size > caps.MaxMsgSize {
			fmt.Printf("%-10d skipped: over the backend's max message size %d\n", size, caps.MaxMsgSize)
			continue
		}
		n := iters
		if caps.Foreign {
			n = iters - warmup
		} else if size > 4096 {
			n = max(1000, min(iters, (256<<20)/size))
		}
		rtt = rtt[:0]
		for i := 0; i < warmup+n; i++ {
			msgs[0].SGEs[0].Length = size
			t0 := time.Now()
			if _, err := ep.SendWait(ctx, msgs); err != nil {
				return err
			}
			msgs[0].SGEs[0].Length = caps.MaxMsgSize
			if _, err := ep.RecvWait(ctx, msgs); err != nil {
				return err
			}
			if i >= warmup {
				rtt = append(rtt, time.Since(t0))
			}
			if msgs[0].Len != size {
				return fmt.Errorf("echo of %d bytes came back with %d", size, msgs[0].Len)
			}
		}
		s := stats.Summarize(rtt)
		fmt.Printf("%-10d %-12d %-12.3f %-12.3f %-12.3f %-12.3f\n", size, n,
			us(s.Min/2), us(s.Median/2), us(s.P99/2), us(s.Max/2))
	}
	if caps.Foreign {
		return nil // the peer stops at its count, as this side has
	}
	// Stop the server and wait for its reply: closing at once could lose
	// the stop message, and the server would only see the peer go.
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Length: 1}}, Flags: fabric.FlagImm, Imm: stopImm}
	if _, err := ep.SendWait(ctx, msgs); err != nil {
		return err
	}
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
	rctx, cancel := context.WithTimeout(ctx, stopReplyTime)
	defer cancel()
	_, err = ep.RecvWait(rctx, msgs)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("no answer to the stop message within %v: the server has gone (with keepalive=0 nothing reports it)", stopReplyTime)
	}
	return err
}
