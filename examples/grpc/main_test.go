package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestGRPC: unary calls of 0 B to 256 KiB and a bidirectional stream,
// concurrently, over one gRPC connection on an emulated NTB bridge; every
// byte is checked.
func TestGRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := listen(ctx, "ntb", filepath.Join(t.TempDir(), "bridge"))
	if err != nil {
		t.Fatal(err)
	}
	s := serve(l)
	defer s.Stop()
	cc, err := dial("ntb", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	payload := func(i int) []byte {
		b := make([]byte, []int{0, 1, 64, 1000, 64 << 10, 256 << 10}[i%6])
		for j := range b {
			b[j] = byte(i*7 + j)
		}
		return b
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 400; i += 4 {
				got, err := callEcho(ctx, cc, payload(i))
				if err != nil {
					errs <- fmt.Errorf("unary %d: %w", i, err)
					return
				}
				if !bytes.Equal(got, payload(i)) {
					errs <- fmt.Errorf("unary %d: %d bytes back, differ", i, len(got))
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		st, err := openChat(ctx, cc)
		if err != nil {
			errs <- err
			return
		}
		const n = 300
		go func() {
			for i := range n {
				if err := st.SendMsg(wrapperspb.Bytes(payload(i))); err != nil {
					errs <- fmt.Errorf("stream send %d: %w", i, err)
					return
				}
			}
			st.CloseSend()
		}()
		for i := range n {
			var m wrapperspb.BytesValue
			if err := st.RecvMsg(&m); err != nil {
				errs <- fmt.Errorf("stream recv %d: %w", i, err)
				return
			}
			if !bytes.Equal(m.Value, payload(i)) {
				errs <- fmt.Errorf("stream message %d differs", i)
				return
			}
		}
		var m wrapperspb.BytesValue
		if err := st.RecvMsg(&m); err == nil {
			errs <- fmt.Errorf("stream: a message past the end")
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestRun runs the program's own path.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, "ntb", filepath.Join(t.TempDir(), "bridge"), 200, 64); err != nil {
		t.Fatal(err)
	}
}
