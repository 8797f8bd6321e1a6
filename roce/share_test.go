package roce

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/link"
)

// shareReport is what a child process of TestSharedPort reports.
type shareReport struct {
	Rank     int
	Block    uint32
	Shared   bool
	Raw      bool
	QPNs     []uint32
	Received int
	Stats    fabric.Stats
	Err      string
}

const (
	shareRanks    = 3
	shareMessages = 3000
)

// TestSharedPort runs 3 processes whose engines all use one address and
// UDP port 4791. Each listens and connects to every other, and every pair
// exchanges numbered messages both ways: it works only if each packet
// reaches the process owning its destination QP. The engines must have
// distinct QPN blocks, their links must be in the steered group, and no
// engine may see a packet for a QP it does not own.
func TestSharedPort(t *testing.T) {
	if os.Getenv("WEFT_ROCE_SHARE_RANK") != "" {
		shareChild(t)
		return
	}
	testenv.RequireRoot(t)
	for _, raw := range []string{"0", "1"} {
		t.Run("raw="+raw, func(t *testing.T) {
			host, _ := testHosts()
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			out := make([][]byte, shareRanks)
			errs := make([]error, shareRanks)
			for r := range shareRanks {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSharedPort$", "-test.v")
				cmd.Env = append(os.Environ(), "WEFT_ROCE_SHARE_RANK="+strconv.Itoa(r),
					"WEFT_ROCE_SHARE_DIR="+dir, "WEFT_ROCE_SHARE_HOST="+host, "WEFT_ROCE_SHARE_RAW="+raw)
				wg.Add(1)
				go func() {
					defer wg.Done()
					out[r], errs[r] = cmd.CombinedOutput()
				}()
			}
			wg.Wait()
			blocks := map[uint32]int{}
			for r := range shareRanks {
				rep, err := readReport(filepath.Join(dir, fmt.Sprintf("report-%d", r)))
				if errs[r] != nil || err != nil || rep.Err != "" {
					t.Fatalf("rank %d: %v / %v / %s\n%s", r, errs[r], err, rep.Err, out[r])
				}
				t.Logf("rank %d: block %d (QPNs %x), shared %v, raw %v, received %d, rx packets %d, drops %v",
					r, rep.Block, rep.QPNs, rep.Shared, rep.Raw, rep.Received, rep.Stats.RxPackets, rep.Stats.Drops)
				if !rep.Shared {
					testenv.SkipOrFail(t, "the port is not shared (no steering program)")
				}
				if prev, dup := blocks[rep.Block]; dup || rep.Block == 0 {
					t.Fatalf("ranks %d and %d share QPN block %d", prev, r, rep.Block)
				}
				blocks[rep.Block] = r
				for _, q := range rep.QPNs {
					if q>>link.QPNBlockBits != rep.Block {
						t.Fatalf("rank %d: QPN %#x outside its block %d", r, q, rep.Block)
					}
				}
				if want := 2 * (shareRanks - 1) * shareMessages; rep.Received != want/2 {
					t.Fatalf("rank %d received %d messages, want %d", r, rep.Received, want/2)
				}
				// A packet steered to the wrong process would be dropped
				// there as addressed to an unknown QP.
				if d := rep.Stats.Drops[fabric.DropOther]; d != 0 {
					t.Fatalf("rank %d dropped %d packets for QPs it does not own", r, d)
				}
				if raw == "1" && !rep.Raw {
					t.Logf("rank %d: no raw socket", r)
				}
			}
		})
	}
}

func readReport(path string) (shareReport, error) {
	var rep shareReport
	b, err := os.ReadFile(path)
	if err != nil {
		return rep, err
	}
	return rep, json.Unmarshal(b, &rep)
}

// shareChild is one rank of TestSharedPort.
func shareChild(t *testing.T) {
	rank, _ := strconv.Atoi(os.Getenv("WEFT_ROCE_SHARE_RANK"))
	dir, host, raw := os.Getenv("WEFT_ROCE_SHARE_DIR"), os.Getenv("WEFT_ROCE_SHARE_HOST"), os.Getenv("WEFT_ROCE_SHARE_RAW")
	rep := shareReport{Rank: rank}
	defer func() {
		b, _ := json.Marshal(rep)
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("report-%d.tmp", rank)), b, 0o644)
		os.Rename(filepath.Join(dir, fmt.Sprintf("report-%d.tmp", rank)), filepath.Join(dir, fmt.Sprintf("report-%d", rank)))
	}()
	err := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
		defer cancel()
		params := "?raw=" + raw
		l, err := fabric.Listen(ctx, "roce", host+":0"+params, nil)
		if err != nil {
			return err
		}
		defer l.Close()
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("addr-%d", rank)), []byte(l.Addr()), 0o644)
		addrs := make([]string, shareRanks)
		for r := range shareRanks {
			for {
				b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("addr-%d", r)))
				if err == nil && len(b) > 0 {
					addrs[r] = string(b)
					break
				}
				if ctx.Err() != nil {
					return fmt.Errorf("no address from rank %d", r)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		var mu sync.Mutex
		var eps []*Endpoint
		var wg sync.WaitGroup
		errc := make(chan error, 2*shareRanks)
		run := func(ep fabric.Endpoint, peer int) {
			defer wg.Done()
			n, err := exchangeNumbered(ctx, ep, rank, peer)
			mu.Lock()
			rep.Received += n
			eps = append(eps, ep.(*Endpoint))
			mu.Unlock()
			if err != nil {
				errc <- fmt.Errorf("with rank %d: %w", peer, err)
			}
		}
		// Dial the higher ranks, accept the lower ones.
		for r := rank + 1; r < shareRanks; r++ {
			ep, err := fabric.Open(ctx, "roce", addrs[r]+params+"&local="+host, nil)
			if err != nil {
				return fmt.Errorf("dial rank %d: %w", r, err)
			}
			defer ep.Close()
			wg.Add(1)
			go run(ep, r)
		}
		for range rank {
			ep, err := l.Accept(ctx)
			if err != nil {
				return fmt.Errorf("accept: %w", err)
			}
			defer ep.Close()
			wg.Add(1)
			go run(ep, -1)
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			return err
		}
		e := eps[0].qp.e
		rep.Block, rep.Stats = e.QPNBlock(), e.Stats()
		if u := e.udpLink(); u != nil {
			rep.Shared, rep.Raw = u.Shared(), u.Raw()
		}
		for _, ep := range eps {
			rep.QPNs = append(rep.QPNs, ep.qp.QPN())
			if ep.qp.e != e {
				return errors.New("endpoints on different engines")
			}
		}
		return nil
	}()
	if err != nil {
		rep.Err = err.Error()
	}
}

// exchangeNumbered sends shareMessages numbered messages to the peer and
// receives as many, checking their order and content; the first message
// each way names the sender. It returns how many it received.
func exchangeNumbered(ctx context.Context, ep fabric.Endpoint, rank, peer int) (int, error) {
	const size = 64
	tx, err := ep.Alloc(size*16, fabric.AccessLocalWrite)
	if err != nil {
		return 0, err
	}
	rx, err := ep.Alloc(size*16, fabric.AccessLocalWrite)
	if err != nil {
		return 0, err
	}
	senderr := make(chan error, 1)
	go func() {
		msgs := make([]fabric.Message, 16)
		for seq := 0; seq < shareMessages; {
			k := min(16, shareMessages-seq)
			for j := range k {
				b := tx.Bytes()[j*size : (j+1)*size]
				binary.LittleEndian.PutUint64(b, uint64(seq+j))
				binary.LittleEndian.PutUint64(b[8:], uint64(rank))
				msgs[j] = fabric.Message{SGEs: []fabric.SGE{{Region: tx, Offset: j * size, Length: size}}}
			}
			n, err := ep.SendWait(ctx, msgs[:k])
			if err != nil {
				senderr <- err
				return
			}
			seq += n
		}
		senderr <- nil
	}()
	msgs := make([]fabric.Message, 16)
	got, from := 0, peer
	for got < shareMessages {
		for j := range msgs {
			msgs[j] = fabric.Message{SGEs: []fabric.SGE{{Region: rx, Offset: j * size, Length: size}}}
		}
		n, err := ep.RecvWait(ctx, msgs)
		if err != nil {
			return got, fmt.Errorf("after %d messages: %w", got, err)
		}
		for j := range n {
			b := rx.Bytes()[j*size : j*size+msgs[j].Len]
			if len(b) != size || binary.LittleEndian.Uint64(b) != uint64(got) {
				return got, fmt.Errorf("message %d: %d bytes, number %d", got, len(b), binary.LittleEndian.Uint64(b))
			}
			f := int(binary.LittleEndian.Uint64(b[8:]))
			if from < 0 {
				from = f
			}
			if f != from || f == rank {
				return got, fmt.Errorf("message %d from rank %d on the connection to rank %d", got, f, from)
			}
			got++
		}
	}
	// Each side stops only once the other has everything: Close then
	// delivers what is left.
	if err := <-senderr; err != nil {
		return got, err
	}
	return got, nil
}

// TestSharedPortHeldAlone: a port bound by a socket that does not share
// it gives a SharedPortError, not a silent share.
func TestSharedPortHeldAlone(t *testing.T) {
	host, _ := testHosts()
	addr := netip.MustParseAddrPort(host + ":4791")
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr)) // no SO_REUSEPORT
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = NewEngine(EngineConfig{Addr: addr, NoRaw: true})
	var se *link.SharedPortError
	if !errors.As(err, &se) || !errors.Is(err, fabric.ErrNotSupported) || !strings.Contains(err.Error(), "local=IP") {
		t.Fatalf("engine on a port held alone elsewhere: %v, want a SharedPortError", err)
	}
}
