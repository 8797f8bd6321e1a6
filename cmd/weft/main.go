// Command weft watches and exercises Weft programs and fabrics.
//
//	weft status [-addr URL] [-json]   endpoints, devices and links of a running program, with state and counters
//	weft watch  [-addr URL] [-n N]    link and peer events of a running program as they happen
//	weft ping   [-backend B] [-server] ADDR   round trips to an echoing peer (weft ping -server, weft-pingpong -server)
//	weft perf   [-backend B] [-server] ADDR   one-way bandwidth and message rate to a weft perf -server
//
// status and watch read what a program exposes with package observe:
// its Registry's Handler served over HTTP, at -addr (default
// $WEFT_OBSERVE, else http://127.0.0.1:9470).
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/stats"
	"github.com/weft-io/weft/observe"

	_ "github.com/weft-io/weft/ethernet"
	_ "github.com/weft-io/weft/ntb"
	_ "github.com/weft-io/weft/roce"
)

// DefaultAddr is where status and watch look without -addr or
// $WEFT_OBSERVE.
const DefaultAddr = "http://127.0.0.1:9470"

func usage() {
	fmt.Fprint(os.Stderr, `usage: weft COMMAND [flags] [ADDR]

commands:
  status   endpoints, devices and links of a running program (state, counters)
  watch    link and peer events of a running program as they happen
  ping     round trips to an echoing peer over a fabric
  perf     bandwidth and message rate to a weft perf -server over a fabric

'weft COMMAND -h' lists a command's flags.
`)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "status":
		err = status(ctx, os.Stdout, args)
	case "watch":
		err = watch(ctx, os.Stdout, args)
	case "ping":
		err = ping(ctx, os.Stdout, args)
	case "perf":
		err = perf(ctx, os.Stdout, args)
	case "-h", "-help", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "weft: unknown command %q\n", cmd)
		usage()
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "weft:", err)
		os.Exit(1)
	}
}

func defaultAddr() string {
	if a := os.Getenv("WEFT_OBSERVE"); a != "" {
		return a
	}
	return DefaultAddr
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// status prints a program's snapshot.
func status(ctx context.Context, w io.Writer, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr(), "URL where the program serves its observe.Handler")
	asJSON := fs.Bool("json", false, "print the snapshot as JSON")
	all := fs.Bool("all", false, "print every counter, zeros included")
	nev := fs.Int("events", 5, "recent events to print")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var s observe.Snapshot
	if err := getJSON(ctx, strings.TrimSuffix(*addr, "/")+"/snapshot", &s); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	printStatus(w, &s, *all, *nev)
	return nil
}

func printStatus(w io.Writer, s *observe.Snapshot, all bool, nev int) {
	fmt.Fprintf(w, "program %s at %s: %d sources\n\n", s.Program, s.Time.Format(time.RFC3339Nano), len(s.Sources))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tBACKEND\tSTATE\tSINCE\tLOCAL\tREMOTE")
	for _, src := range s.Sources {
		since := "-"
		if !src.Since.IsZero() {
			since = s.Time.Sub(src.Since).Round(time.Millisecond).String()
		}
		backend := src.Backend
		if src.Path != "" {
			backend += "/" + src.Path // the carrier the backend chose: roce/shm
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", src.Name, src.Kind, dash(backend), src.State, since, dash(src.Local), dash(src.Remote))
	}
	tw.Flush()
	for _, src := range s.Sources {
		var parts []string
		for _, c := range src.Counters {
			if c.Value != 0 || all || c.Gauge {
				parts = append(parts, fmt.Sprintf("%s=%d", c.Name, c.Value))
			}
		}
		fmt.Fprintf(w, "\n%s: %s", src.Name, strings.Join(parts, " "))
	}
	fmt.Fprintln(w)
	if nev > 0 && len(s.Events) > 0 {
		fmt.Fprintln(w, "\nrecent events:")
		evs := s.Events[max(0, len(s.Events)-nev):]
		for _, e := range evs {
			printEvent(w, e)
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printEvent(w io.Writer, e observe.Event) {
	line := fmt.Sprintf("%s #%d %s %s", e.Time.Format("15:04:05.000000"), e.Seq, e.Source, e.Kind)
	if e.Detail != "" {
		line += ": " + e.Detail
	}
	fmt.Fprintln(w, line)
}

// watch prints a program's events as they happen: it long-polls
// /events, so an event is printed as soon as the program records it.
func watch(ctx context.Context, w io.Writer, args []string) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr(), "URL where the program serves its observe.Handler")
	n := fs.Int("n", 0, "exit after N events (0: never)")
	history := fs.Bool("history", false, "print the events already logged first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	base := strings.TrimSuffix(*addr, "/")
	var after uint64
	if !*history {
		var evs []observe.Event
		if err := getJSON(ctx, base+"/events", &evs); err != nil {
			return err
		}
		if len(evs) > 0 {
			after = evs[len(evs)-1].Seq
		}
	}
	fmt.Fprintf(w, "watching %s\n", base)
	seen := 0
	for {
		var evs []observe.Event
		err := getJSON(ctx, fmt.Sprintf("%s/events?after=%d&wait=30s", base, after), &evs)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Seq > after+1 && after > 0 {
				fmt.Fprintf(w, "(%d events lost: the program's log overflowed)\n", e.Seq-after-1)
			}
			printEvent(w, e)
			after = e.Seq
			if seen++; *n > 0 && seen >= *n {
				return nil
			}
		}
		if f, ok := w.(interface{ Sync() error }); ok {
			f.Sync()
		}
	}
}

// stopImm is the immediate of the message that ends a ping or perf
// session (the same as weft-pingpong's).
const stopImm = 0x5707

func openFlags(name string, args []string) (*flag.FlagSet, *string, *bool, *time.Duration) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	backend := fs.String("backend", "ntb", "backend: "+strings.Join(fabric.Backends(), ", "))
	server := fs.Bool("server", false, "serve: echo (ping) or count (perf) until the client stops")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the peer")
	return fs, backend, server, timeout
}

func openEP(ctx context.Context, backend, addr string, timeout time.Duration) (fabric.Endpoint, error) {
	octx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ep, err := fabric.Open(octx, backend, addr, nil)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("no peer at %s %s within %v: %w", backend, addr, timeout, err)
	}
	return ep, err
}

// ping measures round trips of messages of -size bytes.
func ping(ctx context.Context, w io.Writer, args []string) error {
	fs, backend, server, timeout := openFlags("ping", args)
	size := fs.Int("size", 64, "message size in bytes")
	count := fs.Int("c", 1000, "round trips")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("ping: want one ADDR (see weft-pingpong -help-addr)")
	}
	ep, err := openEP(ctx, *backend, fs.Arg(0), *timeout)
	if err != nil {
		return err
	}
	defer ep.Close()
	if *server {
		return echo(ctx, ep)
	}
	caps := ep.Caps()
	if *size < 1 || *size > caps.MaxMsgSize {
		return fmt.Errorf("ping: size %d: want 1 to %d: %w", *size, caps.MaxMsgSize, fabric.ErrMessageSize)
	}
	buf, err := ep.Alloc(caps.MaxMsgSize, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf}}}}
	rtt := make([]time.Duration, 0, *count)
	for i := 0; i < *count; i++ {
		msgs[0].SGEs[0].Length, msgs[0].Flags = *size, 0
		t0 := time.Now()
		if _, err := ep.SendWait(ctx, msgs); err != nil {
			return err
		}
		msgs[0].SGEs[0].Length = caps.MaxMsgSize
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			return err
		}
		rtt = append(rtt, time.Since(t0))
		if msgs[0].Len != *size {
			return fmt.Errorf("ping: echo of %d bytes came back with %d", *size, msgs[0].Len)
		}
	}
	s := stats.Summarize(rtt)
	fmt.Fprintf(w, "%s %s: %d round trips of %d bytes: min %v median %v p99 %v max %v\n",
		*backend, fs.Arg(0), len(rtt), *size, s.Min, s.Median, s.P99, s.Max)
	return stopPeer(ctx, ep, buf)
}

// stopPeer sends the stop message and waits for the reply, so that the
// peer ends cleanly before this side closes.
func stopPeer(ctx context.Context, ep fabric.Endpoint, buf *fabric.Region) error {
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: 1}}, Flags: fabric.FlagImm, Imm: stopImm}}
	if _, err := ep.SendWait(ctx, msgs); err != nil {
		return err
	}
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
	_, err := ep.RecvWait(ctx, msgs)
	return err
}

// echo returns every message until the stop message, which it answers.
func echo(ctx context.Context, ep fabric.Endpoint) error {
	return serveLoop(ctx, ep, true, nil)
}

// serveLoop receives until the stop message; with reply it echoes each
// message, and it counts what arrived in *got.
func serveLoop(ctx context.Context, ep fabric.Endpoint, reply bool, got *[2]uint64) error {
	buf, err := ep.Alloc(ep.Caps().MaxMsgSize*16, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	mx := ep.Caps().MaxMsgSize
	msgs := make([]fabric.Message, 16)
	sges := make([]fabric.SGE, 16)
	for i := range msgs {
		sges[i] = fabric.SGE{Region: buf, Offset: i * mx, Length: mx}
		msgs[i].SGEs = sges[i : i+1]
	}
	for {
		for i := range msgs {
			sges[i].Length = mx
		}
		n, err := ep.RecvWait(ctx, msgs)
		if err != nil {
			if errors.Is(err, fabric.ErrPeerGone) {
				return nil
			}
			return err
		}
		for i := 0; i < n; i++ {
			m := &msgs[i]
			if m.Flags&fabric.FlagImm != 0 && m.Imm == stopImm {
				out := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: 8}}}}
				if got != nil {
					binary.LittleEndian.PutUint64(buf.Bytes(), got[1])
				}
				_, err := ep.SendWait(ctx, out)
				return err
			}
			if got != nil {
				got[0]++
				got[1] += uint64(m.Len)
			}
			if reply {
				sges[i].Length = m.Len
				m.Flags = 0
				if _, err := ep.SendWait(ctx, msgs[i:i+1]); err != nil {
					return err
				}
			}
		}
	}
}

// perf streams messages of -size bytes for -t and reports the rate the
// server received.
func perf(ctx context.Context, w io.Writer, args []string) error {
	fs, backend, server, timeout := openFlags("perf", args)
	size := fs.Int("size", 65536, "message size in bytes")
	dur := fs.Duration("t", 2*time.Second, "how long to send")
	burst := fs.Int("burst", 16, "messages per burst")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("perf: want one ADDR (see weft-pingpong -help-addr)")
	}
	ep, err := openEP(ctx, *backend, fs.Arg(0), *timeout)
	if err != nil {
		return err
	}
	defer ep.Close()
	if *server {
		var got [2]uint64
		start := time.Now()
		err := serveLoop(ctx, ep, false, &got)
		fmt.Fprintf(w, "received %d messages, %d bytes in %v\n", got[0], got[1], time.Since(start).Round(time.Millisecond))
		return err
	}
	caps := ep.Caps()
	if *size < 1 || *size > caps.MaxMsgSize {
		return fmt.Errorf("perf: size %d: want 1 to %d: %w", *size, caps.MaxMsgSize, fabric.ErrMessageSize)
	}
	// Messages above the inline size hold their buffer until completion:
	// give each message of a burst its own buffer and reap completions.
	buf, err := ep.Alloc(max(*size, 8)**burst, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	msgs := make([]fabric.Message, *burst)
	for i := range msgs {
		msgs[i].SGEs = []fabric.SGE{{Region: buf, Offset: i * *size, Length: *size}}
	}
	signal := *size > caps.InlineSize
	comps := make([]fabric.Completion, *burst)
	var sent uint64
	start := time.Now()
	for time.Since(start) < *dur {
		for i := range msgs {
			msgs[i].Flags = 0
			if signal && i == len(msgs)-1 {
				msgs[i].Flags = fabric.FlagSignal
			}
		}
		k := 0
		for k < len(msgs) {
			n, err := ep.SendWait(ctx, msgs[k:])
			if err != nil {
				return err
			}
			k += n
		}
		sent += uint64(len(msgs))
		if signal {
			if _, err := ep.CQ().Wait(ctx, comps); err != nil {
				return err
			}
		}
	}
	msgs[0].SGEs[0].Length = 8
	if err := stopPeer(ctx, ep, buf); err != nil {
		return err
	}
	el := time.Since(start)
	got := binary.LittleEndian.Uint64(buf.Bytes())
	fmt.Fprintf(w, "%s %s: %d messages of %d bytes in %v: %.2f Gbit/s, %.0f msg/s (server received %d bytes)\n",
		*backend, fs.Arg(0), sent, *size, el.Round(time.Millisecond),
		float64(sent)*float64(*size)*8/el.Seconds()/1e9, float64(sent)/el.Seconds(), got)
	return nil
}
