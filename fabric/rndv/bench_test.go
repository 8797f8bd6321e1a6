package rndv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// BenchmarkThreshold streams messages of each size from one Conn to the
// other, eagerly and by rendezvous, into the receiver's own buffer (a
// region the peer may write): where the lines cross is the backend's
// threshold (DefaultThreshold). The receiver runs on its own goroutine,
// as ucx_perftest's tag_bw does in its own process.
func BenchmarkThreshold(b *testing.B) {
	for _, be := range backends {
		for _, size := range []int{1 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20} {
			for _, mode := range []struct {
				name   string
				thresh int
			}{{"eager", -1}, {"rndv", 1}} {
				b.Run(fmt.Sprintf("%s/%s/%s", be.name, sizeName(size), mode.name), func(b *testing.B) {
					benchStream(b, be, size, mode.thresh)
				})
			}
		}
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// benchStream sends b.N messages of size bytes from a to b.
func benchStream(b *testing.B, be backend, size, thresh int) {
	x, y := conns(b, be, &Options{Threshold: thresh})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := alloc(b, x, size, 0)
	dst := alloc(b, y, size, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	ack := alloc(b, y, 1, 0)
	fin := alloc(b, x, 1, fabric.AccessLocalWrite)
	n := b.N
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			if _, err := y.Recv(ctx, fabric.SGEOf(dst)); err != nil {
				errc <- err
				return
			}
		}
		errc <- y.Send(ctx, fabric.SGEOf(ack))
	}()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		if err := x.Send(ctx, fabric.SGEOf(src)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := x.Recv(ctx, fabric.SGEOf(fin)); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkProcesses is BenchmarkThreshold's ntb stream with the
// receiver in another process (this test binary again, see TestMain), as
// ucx_perftest runs: the two ends share only the emulated bridge's memory.
func BenchmarkProcesses(b *testing.B) {
	for _, size := range []int{8 << 10, 64 << 10, 1 << 20} {
		for _, mode := range []struct {
			name   string
			thresh int
		}{{"eager", -1}, {"rndv", 1}} {
			b.Run(fmt.Sprintf("ntb/%s/%s", sizeName(size), mode.name), func(b *testing.B) {
				benchProcesses(b, size, mode.thresh)
			})
		}
	}
}

// The child's instructions: the bridge, the message size, the count and
// the threshold.
const childEnv = "WEFT_RNDV_BENCH_CHILD"

func benchProcesses(b *testing.B, size, thresh int) {
	path := filepath.Join(b.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%d", childEnv, path, size, b.N, thresh))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := cmd.Wait(); err != nil {
			b.Errorf("the receiver: %v\n%s", err, out.String())
		}
	}()
	ep, err := fabric.Open(ctx, "ntb", path, nil)
	if err != nil {
		cmd.Process.Kill()
		b.Fatal(err)
	}
	x, err := New(ep, &Options{Threshold: thresh})
	if err != nil {
		ep.Close()
		cmd.Process.Kill()
		b.Fatal(err)
	}
	defer x.Close()
	src := alloc(b, x, size, 0)
	fin := alloc(b, x, 1, fabric.AccessLocalWrite)
	// The first message and its answer prove the child is there.
	if err := x.Send(ctx, fabric.SGEOf(src)); err != nil {
		b.Fatal(err)
	}
	if _, err := x.Recv(ctx, fabric.SGEOf(fin)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := x.Send(ctx, fabric.SGEOf(src)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := x.Recv(ctx, fabric.SGEOf(fin)); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

// benchChild is the receiving process of BenchmarkProcesses: spec is
// "path,size,count,threshold". It returns the exit code.
func benchChild(spec string) int {
	var path string
	var size, count, thresh int
	parts := strings.Split(spec, ",")
	if len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "bad spec", spec)
		return 2
	}
	path = parts[0]
	for i, p := range []*int{&size, &count, &thresh} {
		v, err := strconv.Atoi(parts[i+1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "bad spec", spec)
			return 2
		}
		*p = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ep, err := fabric.Open(ctx, "ntb", path, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	y, err := New(ep, &Options{Threshold: thresh})
	if err != nil {
		ep.Close()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer y.Close()
	dst, err1 := ep.Alloc(size, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	ack, err2 := ep.Alloc(1, 0)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for round, n := range []int{1, count} {
		for i := 0; i < n; i++ {
			if _, err := y.Recv(ctx, fabric.SGEOf(dst)); err != nil {
				fmt.Fprintln(os.Stderr, "round", round, "message", i, err)
				return 1
			}
		}
		if err := y.Send(ctx, fabric.SGEOf(ack)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	// The sender closes first: wait for it, so the last ack is taken.
	y.Recv(ctx, fabric.SGEOf(dst))
	return 0
}
