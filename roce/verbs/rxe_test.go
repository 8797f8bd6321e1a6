//go:build rxe

package verbs

// The proof on the kernel's verbs: the Soft-RoCE VMs of ../shared/rxe-vm
// (kernel rxe, rdma-core 44, as on this host) run a test binary of this
// package built with -tags rdma, which reaches rxe0 through libibverbs.
// One run boots two guests and walks through:
//
//  1. the conformance suite guest to guest over the verbs backend, plus
//     the binding's own tests and benchmarks in guest 0;
//  2. the verbs backend against rdma-core's ibv_rc_pingpong and
//     ibv_ud_pingpong in the other guest, as client and as server;
//  3. rdma_cm through librdmacm: the binding's rdma_cm tests in guest 1
//     (the suite over verbs Listen, the listener cases, DREQ as peer loss,
//     REJ as ErrRefused) while guest 0 runs step 1; the suite guest to
//     guest over rdmacm://; Weft against librdmacm's rdma_server and
//     rdma_client and against rping (READ and WRITE of advertised
//     buffers), each way;
//  4. the conformance suite between the verbs backend in the guests and
//     Weft's user-space engine on the host side of the bridge (10.77.0.1):
//     over rdma_cm from guest 1 while guest 0 runs step 1 (to the engine's
//     fabric.Listen on rdmacm://10.77.0.1:7471), over the pingpong
//     exchange from guest 0 at the end.
//
//	go test -tags rxe -run TestVerbsInterop -v ./roce/verbs/
//
// It needs root, the harness and libibverbs-dev (to build the guest
// binary with cgo).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	_ "github.com/weft-io/weft/roce"
)

var (
	rcSizes = []int{1, 64, 1024, 4096, 65536}
	udSizes = []int{64, 1024}
)

// guestScript is the script both guests run; GUEST_INDEX picks the part.
func guestScript() string {
	var g0, g1 strings.Builder
	// Every step prints ">>> name" as it starts and "<<< name ok|FAILED
	// in Ns" as it ends, so a failed run says which step failed or never
	// ended (see stepSummary). The programs of rdma-core and librdmacm
	// run under timeout: a server whose Weft client failed waits for a
	// connection for ever, and would hold the whole run until the
	// harness kills it.
	run := func(b *strings.Builder, name, cmd string) {
		fmt.Fprintf(b, "  echo '>>> %s'; s=$(date +%%s); r=ok\n  if ! %s; then echo 'STEP FAILED: %s'; fail=1; r=FAILED; fi\n"+
			"  echo \"<<< %s $r in $(($(date +%%s)-s))s\"\n", name, cmd, name, name)
	}
	const T = "env CI=true /share/verbs.test -test.v -test.parallel 4"
	// 1. The binding's own tests, then the suite guest to guest.
	// Guest 1 waits for guest 0 in the steps below: meanwhile it runs the
	// binding's rdma_cm tests on its own device, then the suite against
	// the user-space engine on the host over rdma_cm (step 4).
	run(&g1, "binding-cm-tests", T+" -test.timeout 8m -test.run '^(TestConformanceCM|TestListenerCM|TestCMPeerGone|TestCMRefused)$'")
	run(&g1, "fabrictest-engine-cm-B", "WEFT_SIDE=B WEFT_ADDR='rdmacm://10.77.0.1:7471' "+T+" -test.timeout 8m -test.run '^TestGuestSide$'")
	run(&g0, "binding-tests", T+" -test.timeout 8m -test.run '^(TestDevices|TestConformance|TestConformanceUD|TestAtomics|TestZeroAllocs|TestPeerGone)$'")
	run(&g0, "binding-bench", "/share/verbs-bench.test -test.run '^$' -test.bench 'CgoCall|Post' -test.benchtime 20000x -test.count 3")
	// The guests are emulated (TCG) and share a loaded 2-core host: a
	// guest stalls for longer than the default local ACK timeout (14:
	// 67 ms) times its retries, which failed OrderedBursts and Views with
	// "retry count exceeded". The rdma_cm steps below get the path's (19,
	// about 2 s) from the rdma_cm; these take the same.
	run(&g0, "fabrictest-guest-A", "WEFT_SIDE=A WEFT_ADDR='listen:10.77.0.2:18515?timeout=19' "+T+" -test.timeout 8m -test.run '^TestGuestSide$'")
	run(&g1, "fabrictest-guest-B", "WEFT_SIDE=B WEFT_ADDR='10.77.0.2:18515?timeout=19' "+T+" -test.timeout 8m -test.run '^TestGuestSide$'")
	// 2. rdma-core's pingpongs. Their queue pairs grant no remote access,
	// so Weft's keep-alive (a zero-length WRITE) is off.
	weft := func(b *strings.Builder, name, addr string, size int, client bool) {
		c := ""
		if client {
			c = "WEFT_PP_CLIENT=1 "
		}
		run(b, name, fmt.Sprintf("%sWEFT_PP_ADDR='%s' WEFT_PP_SIZE=%d %s -test.timeout 5m -test.run '^TestGuestPingpong$'", c, addr, size, T))
	}
	for _, pp := range []struct {
		qp, params string
		sizes      []int
	}{{"rc", "keepalive=0", rcSizes}, {"ud", "type=ud", udSizes}} {
		prog := "ibv_" + pp.qp + "_pingpong"
		for _, s := range pp.sizes {
			run(&g0, fmt.Sprintf("%s-server-%d", prog, s), fmt.Sprintf("timeout 240 %s -d rxe0 -g 1 -n 50 -s %d", prog, s))
			weft(&g1, fmt.Sprintf("weft-%s-client-%d", pp.qp, s), "10.77.0.2:18515?"+pp.params, s, true)
		}
		for _, s := range pp.sizes {
			weft(&g1, fmt.Sprintf("weft-%s-server-%d", pp.qp, s), "listen:10.77.0.3:18515?"+pp.params, s, false)
			run(&g0, fmt.Sprintf("%s-client-%d", prog, s), fmt.Sprintf("retry timeout 120 %s -d rxe0 -g 1 -n 50 -s %d 10.77.0.3", prog, s))
		}
	}
	// 3. rdma_cm guest to guest: the suite, then librdmacm's programs.
	run(&g0, "fabrictest-cm-guest-A", "WEFT_SIDE=A WEFT_ADDR='rdmacm://listen:10.77.0.2:7472' "+T+" -test.timeout 8m -test.run '^TestGuestSide$'")
	run(&g1, "fabrictest-cm-guest-B", "WEFT_SIDE=B WEFT_ADDR='rdmacm://10.77.0.2:7472' "+T+" -test.timeout 8m -test.run '^TestGuestSide$'")
	run(&g0, "rdma_server", "timeout 240 rdma_server")
	run(&g1, "weft-rdma-client", "WEFT_RC_ADDR='rdmacm://10.77.0.2:7471' "+T+" -test.timeout 5m -test.run '^TestGuestRdmaCM$'")
	run(&g1, "weft-rdma-server", "WEFT_RC_ADDR='rdmacm://listen:10.77.0.3:7471' "+T+" -test.timeout 5m -test.run '^TestGuestRdmaCM$'")
	run(&g0, "rdma_client", "retry timeout 120 rdma_client -s 10.77.0.3")
	// rping: SENDs of buffer advertisements, RDMA READ and WRITE of them
	// (rping asks for one READ outstanding each way: resp_res, init_depth).
	run(&g0, "rping-server", "timeout 240 rping -s -a 10.77.0.2 -C 20")
	run(&g1, "weft-rping-client", "WEFT_RPING_ADDR='rdmacm://10.77.0.2:7174?resp_res=1&init_depth=1' WEFT_RPING_COUNT=20 "+T+" -test.timeout 5m -test.run '^TestGuestRping$'")
	run(&g1, "weft-rping-server", "WEFT_RPING_ADDR='rdmacm://listen:10.77.0.3:7174?resp_res=1&init_depth=1' WEFT_RPING_COUNT=20 "+T+" -test.timeout 5m -test.run '^TestGuestRping$'")
	run(&g0, "rping-client", "retry timeout 120 rping -c -a 10.77.0.3 -C 20 -V")
	// 4. The suite against the user-space engine on the host over the
	// pingpong exchange (guest 1 ran it over rdma_cm at the start).
	run(&g0, "fabrictest-engine-B", "WEFT_SIDE=B WEFT_ADDR='10.77.0.1:18515' "+T+" -test.timeout 8m -test.run '^TestGuestSide$'")
	return "#!/bin/sh\n# Generated by roce/verbs/rxe_test.go.\nfail=0\n" +
		"retry() { end=$(($(date +%s)+120)); until \"$@\"; do [ $(date +%s) -ge $end ] && return 1; sleep 1; done; }\n" +
		"if [ \"$GUEST_INDEX\" = 0 ]; then\n" + g0.String() + "else\n" + g1.String() + "fi\nexit $fail\n"
}

// TestVerbsInterop builds the guest binary, boots two guests and checks
// every step passed, with no test skipped for a missing device.
func TestVerbsInterop(t *testing.T) {
	testenv.RequireRoot(t)
	harness := testenv.RxeHarness(t)
	dir := t.TempDir()
	// The tests run with the race detector; the benchmarks without.
	bin := filepath.Join(dir, "verbs.test")
	benchBin := filepath.Join(dir, "verbs-bench.test")
	for _, b := range [][]string{{"-race", "-o", bin}, {"-o", benchBin}} {
		build := exec.Command("go", append(append([]string{"test", "-c", "-tags", "rdma"}, b...), ".")...)
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			testenv.SkipOrFail(t, fmt.Sprintf("cannot build the cgo test binary (libibverbs-dev?): %v\n%s", err, out))
		}
	}
	script := filepath.Join(dir, "guest.sh")
	if err := os.WriteFile(script, []byte(guestScript()), 0o755); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(dir, "verbs.pcap")
	if p := os.Getenv("WEFT_RXE_PCAP"); p != "" {
		pcap = p
	}
	cmd := exec.Command(filepath.Join(harness, "run.sh"), "-n", "2", "-t", "1500", "-c", pcap, "-f", bin, "-f", benchBin, script,
		os.Args[0], "-test.run=^TestVerbsHost$", "-test.v", "-test.timeout=24m")
	cmd.Env = append(os.Environ(), "WEFT_VERBS_HOST=1")
	out, err := cmd.CombinedOutput()
	t.Logf("harness output:\n%s", out)
	if err != nil {
		t.Fatalf("interop failed: %v (capture in %s)\n%s", err, pcap, stepSummary(out))
	}
	for _, bad := range []string{"STEP FAILED", "--- FAIL", "panic:"} {
		if bytes.Contains(out, []byte(bad)) {
			t.Fatalf("interop failed: output has %q (capture in %s)\n%s", bad, pcap, stepSummary(out))
		}
	}
	if !bytes.Contains(out, []byte("--- PASS: TestVerbsHost")) {
		t.Fatalf("the host side did not pass")
	}
	// Every guest step printed its marker and no step's test was skipped
	// for want of a device (CI=true in the guests turns that into a
	// failure, caught above).
	steps := regexp.MustCompile(`(?m)^>>> (\S+)`).FindAllSubmatch(out, -1)
	if want := strings.Count(guestScript(), "echo '>>> "); len(steps) != want {
		t.Fatalf("%d steps ran, want %d", len(steps), want)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*Benchmark\S+\s+\d+.*$`).FindAll(out, -1) {
		t.Logf("guest benchmark (emulated timing): %s", m)
	}
}

// stepSummary lists, from the harness output, the guest steps that failed
// or never ended, each with the end of what it printed, and how long every
// step took: the harness output is long, and a CI log keeps its head and
// its tail, which is where this goes.
func stepSummary(out []byte) string {
	var b strings.Builder
	section, step, start := "", "", 0
	lines := strings.Split(string(out), "\n")
	tail := func(from, to int) {
		from = max(from, to-30)
		for _, l := range lines[from:to] {
			fmt.Fprintf(&b, "\t| %s\n", l)
		}
	}
	var times []string
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "=== guest ") || strings.HasPrefix(l, "=== host"):
			if step != "" {
				fmt.Fprintf(&b, "%s: step %s never ended; its last lines:\n", section, step)
				tail(start, i)
			}
			section, step = strings.TrimPrefix(l, "=== "), ""
		case strings.HasPrefix(section, "host") && (strings.Contains(l, "--- FAIL") || strings.Contains(l, "panic:")):
			fmt.Fprintf(&b, "host: %s\n", strings.TrimSpace(l))
		case strings.HasPrefix(l, ">>> "):
			step, start = strings.TrimPrefix(l, ">>> "), i
		case strings.HasPrefix(l, "<<< "):
			f := strings.Fields(l) // <<< name ok|FAILED in Ns
			if len(f) == 5 {
				times = append(times, f[1]+" "+f[4])
				if f[2] != "ok" {
					fmt.Fprintf(&b, "%s: step %s failed in %s; its last lines:\n", section, f[1], f[4])
					tail(start, i)
				}
			}
			step = ""
		}
	}
	if step != "" {
		fmt.Fprintf(&b, "%s: step %s never ended; its last lines:\n", section, step)
		tail(start, len(lines))
	}
	fmt.Fprintf(&b, "steps that ended: %s\n", strings.Join(times, ", "))
	return b.String()
}

// TestVerbsHost is the host side of step 4: role A of the suite on Weft's
// user-space engine, listening on the bridge for the pingpong exchange
// and, from the start, through rdma_cm (one fabric.Listen, an Accept per
// case). The harness runs it.
func TestVerbsHost(t *testing.T) {
	if os.Getenv("WEFT_VERBS_HOST") != "1" {
		t.Skip("run by TestVerbsInterop inside the harness")
	}
	// Guest 0 gets to the pingpong exchange after steps 1 to 3.
	const firstWait = 20 * time.Minute
	t.Run("pingpong", func(t *testing.T) {
		t.Parallel()
		first := true
		fabrictest.TestSide(t, fabrictest.SideA, func(t testing.TB, key string, s fabrictest.Side) fabric.Endpoint {
			d := 2 * time.Minute
			if first {
				d, first = firstWait, false
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			ep, err := fabric.Open(ctx, "roce", "listen:10.77.0.1:18515?maxmsg=65536", nil)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return ep
		})
	})
	t.Run("rdmacm", func(t *testing.T) {
		t.Parallel()
		l := fabrictest.Listen(t, "roce", "rdmacm://10.77.0.1:7471?maxmsg=65536", nil)
		first := true
		fabrictest.TestSide(t, fabrictest.SideA, func(t testing.TB, key string, s fabrictest.Side) fabric.Endpoint {
			d := 2 * time.Minute
			if first {
				d, first = firstWait, false
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			ep, err := l.Accept(ctx)
			if err != nil {
				t.Fatalf("Accept: %v", err)
			}
			return ep
		})
	})
}
