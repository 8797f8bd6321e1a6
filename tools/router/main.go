// Command router is a horizontally scaled software router built on Weft,
// after RouteBricks and the RoCE back-plane study that Weft's README
// cites: 2 to 4 forwarding nodes, each in its own network namespace with
// an AF_XDP ingress and egress port, a 100,000-route FIB, and a full-mesh
// back-plane over ntb, roce or ethernet (optionally batched), fed by a
// generator and measured by a sink in namespaces of their own. Over verbs
// (RDMA NICs or Soft-RoCE; build with -tags rdma) each node is on a
// machine of its own: every machine runs the command with -addrs and its
// -rank, and rank 0 reports.
//
// As root, with no arguments, it builds everything, compares the
// back-planes at sizes 64 to 1500 beside the single-node floor, removes
// everything it created (also on Ctrl-C), prints a table and the seed's
// three claims as ratios, and writes router.json and router.png:
//
//	go -C tools run ./router
//	go -C tools run ./router -backplanes ntb,ntb+batch -nodes 3 -sizes 64,1500 -duration 2s
//	go -C tools run ./router -tune            # the parameter search; writes router-tuned.json
//	go -C tools run ./router -settings router-tuned.json
//	go -C tools run -tags rdma ./router -backplanes verbs -addrs 10.77.0.2,10.77.0.3 -rank 0
//
// The same binary is each node, the generator and the sink (-role).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/weft-io/weft/ntb"        // the "ntb" back-plane
	_ "github.com/weft-io/weft/roce"       // the "roce" back-plane
	_ "github.com/weft-io/weft/roce/verbs" // the "verbs" back-plane (build with -tags rdma)
	"github.com/weft-io/weft/tools/measure"
)

func main() {
	role := flag.String("role", "", "internal: node, gen or sink")
	backplanes := flag.String("backplanes", "none,ethernet,roce,roce+batch,ntb,ntb+batch", "back-planes to compare (none: the single-node floor)")
	nodes := flag.Int("nodes", 2, "forwarding nodes (2 to 4)")
	sizes := flag.String("sizes", "64,128,256,512,1024,1500", "frame sizes in bytes")
	dur := flag.Duration("duration", 2*time.Second, "length of each measurement")
	rate := flag.Float64("rate", 0, "offered load of the throughput phase, packets/s (0: as fast as the generator can)")
	latRate := flag.Float64("lat-rate", 5000, "fixed offered load of the latency phase, packets/s (0: skip)")
	routes := flag.Int("routes", 100000, "FIB size")
	bad := flag.Int("bad", 0, "make every N-th generated packet malformed, expired or unroutable")
	kill := flag.Int("kill", -1, "kill node N a third into each throughput phase and restart it")
	settings := flag.String("settings", "", "node settings: a file written by -tune, or JSON")
	out := flag.String("out", "router", "prefix of the JSON and PNG files")
	tune := flag.Bool("tune", false, "search the parameters per back-plane and size; write <out>-tuned.json")
	reps := flag.Int("reps", 3, "with -tune: runs per setting (the median counts)")
	addrs := flag.String("addrs", "", "one node per machine (the verbs back-plane): every node's RDMA address by rank, comma-separated; this machine runs node -rank, rank 0 reports")
	// internal flags of the roles
	rank := flag.Int("rank", 0, "with -addrs: this machine's node; internal: node rank")
	bp := flag.String("backplane", "none", "internal: the node's back-plane")
	dir := flag.String("dir", "", "internal: NTB bridge directory")
	ports := flag.String("ports", "", "internal: interfaces of the generator or sink")
	ranks := flag.String("ranks", "", "internal: the node behind each generator port")
	macs := flag.String("macs", "", "internal: the nodes' ingress MACs")
	size := flag.Int("size", 64, "internal: generator frame size")
	rejoin := flag.Bool("rejoin", false, "internal: the node was restarted")
	flag.Parse()
	measure.InitClock() // a host without CLOCK_MONOTONIC still forwards; its latencies are wrong

	set := DefaultSettings
	tuned := Tuned{}
	if *settings != "" {
		var err error
		if strings.HasPrefix(*settings, "{") {
			err = jsonUnmarshal(*settings, &set)
		} else {
			tuned, err = loadTuned(*settings)
		}
		check(err)
	}
	setNap(time.Duration(set.Nap))
	var machine *Machine
	if *addrs != "" {
		as, err := parseAddrs(*addrs)
		check(err)
		machine = &Machine{Rank: *rank, Addrs: as}
	}
	switch *role {
	case "node":
		nc := NodeConfig{Rank: *rank, Nodes: *nodes, Backplane: *bp, Dir: *dir, Routes: *routes, Settings: set, Rejoin: *rejoin}
		if machine != nil {
			nc.Addrs = machine.Addrs
		}
		check(runNode(nc))
		return
	case "gen":
		gc := GenConfig{Ports: strings.Split(*ports, ","), Size: *size, Rate: *rate, Duration: *dur, Nodes: *nodes, Routes: *routes, BadEvery: *bad}
		for _, r := range strings.Split(*ranks, ",") {
			if r != "" {
				v, err := strconv.Atoi(r)
				check(err)
				gc.Ranks = append(gc.Ranks, v)
			}
		}
		for _, m := range strings.Split(*macs, ",") {
			hw, err := parseMAC(m)
			check(err)
			gc.DstMACs = append(gc.DstMACs, hw)
		}
		res, err := runGen(context.Background(), gc)
		check(err)
		printJSON(res)
		return
	case "sink":
		ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer cancel()
		res, err := runSink(ctx, strings.Split(*ports, ","), time.Duration(set.Spin), func() { fmt.Println("ready") })
		check(err)
		printJSON(res)
		return
	case "":
	default:
		check(fmt.Errorf("unknown role %q", *role))
	}

	if os.Geteuid() != 0 {
		check(fmt.Errorf("needs root (namespaces, AF_XDP)"))
	}
	bps := strings.Split(*backplanes, ",")
	check(checkMachineRun(bps, machine, *tune, *kill))
	if machine != nil {
		*nodes = len(machine.Addrs)
		*latRate = 0 // one-way latency needs one clock
	}
	if *nodes < 2 || *nodes > 4 {
		check(fmt.Errorf("-nodes %d: want 2 to 4", *nodes))
	}
	for _, ns := range Leftovers(false) {
		ipCmd("netns", "del", ns) // a run that was SIGKILLed
	}
	removeStaleShm()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	// A closed output pipe (| head) must not kill us before we clean up:
	// with SIGPIPE caught, writes fail with EPIPE instead.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	rc := RunConfig{
		Backplanes: bps, Nodes: *nodes, Duration: *dur, Rate: *rate,
		LatRate: *latRate, Routes: *routes, Bad: *bad, Tuned: tuned, Defaults: set, Kill: *kill,
		Log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }, Machine: machine,
	}
	for _, s := range strings.Split(*sizes, ",") {
		v, err := strconv.Atoi(s)
		check(err)
		rc.Sizes = append(rc.Sizes, v)
	}
	var err error
	if *tune {
		err = Tune(ctx, rc, *out+"-tuned.json", *reps)
	} else {
		var rows []Row
		rows, err = Run(ctx, rc)
		if machine == nil || machine.Rank == 0 {
			report(os.Stdout, rc, rows, *out)
		}
	}
	killChildren()
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "interrupted; cleaned up")
	}
	for _, ns := range Leftovers(false) {
		ipCmd("netns", "del", ns)
	}
	check(err)
}

func check(err error) {
	if err != nil {
		killChildren()
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(1)
	}
}
