package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/sock"
	_ "github.com/weft-io/weft/ntb" // registers the "ntb" backend
)

func main() {
	backend := flag.String("backend", "ntb", "fabric backend with a listener, or tcp (loopback, for reference)")
	addr := flag.String("addr", "", "listen address (default: an emulated bridge in a temporary file)")
	calls := flag.Int("calls", 2000, "unary calls and stream messages")
	size := flag.Int("size", 64, "bytes per call")
	spin := flag.Duration("spin", 0, "how long blocking receives busy-poll before they sleep (0: the backend's default, negative: sleep at once)")
	flag.Parse()
	config = &sock.Config{Options: fabric.Options{Spin: *spin}}
	if *addr == "" {
		dir, err := os.MkdirTemp("", "weft-grpc")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		*addr = filepath.Join(dir, "bridge")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *backend, *addr, *calls, *size); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, backend, addr string, calls, size int) error {
	l, err := listen(ctx, backend, addr)
	if err != nil {
		return err
	}
	s := serve(l)
	defer s.Stop()
	cc, err := dial(backend, l.Addr().String())
	if err != nil {
		return err
	}
	defer cc.Close()

	msg := bytes.Repeat([]byte{0xa5}, size)
	start := time.Now()
	for i := range calls {
		got, err := callEcho(ctx, cc, msg)
		if err != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("call %d: answer differs", i)
		}
	}
	d := time.Since(start)
	fmt.Printf("unary:  %d calls of %d B over %s in %v: %.0f calls/s\n", calls, size, backend, d.Round(time.Millisecond), float64(calls)/d.Seconds())

	st, err := openChat(ctx, cc)
	if err != nil {
		return err
	}
	start = time.Now()
	for i := range calls {
		if err := st.SendMsg(wrapperspb.Bytes(msg)); err != nil {
			return fmt.Errorf("stream send %d: %w", i, err)
		}
		var m wrapperspb.BytesValue
		if err := st.RecvMsg(&m); err != nil {
			return fmt.Errorf("stream recv %d: %w", i, err)
		}
	}
	st.CloseSend()
	d = time.Since(start)
	fmt.Printf("stream: %d messages of %d B over %s in %v: %.0f round trips/s\n", calls, size, backend, d.Round(time.Millisecond), float64(calls)/d.Seconds())
	return nil
}
