package fabrictest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// The Mistakes case: the same mistake gives the same sentinel on every
// backend, whichever operation it is made on. Each class of mistake is
// made on every operation that takes it, and must fail at once with
// n == 0 and an error matching:
//
//   - an SGE without a region: fabric.ErrInvalid;
//   - an SGE outside its region (past its end, negative offset):
//     fabric.ErrBounds;
//   - more SGEs than Caps.MaxSGEs, or a message over Caps.MaxMsgSize:
//     fabric.ErrMessageSize;
//   - RMA whose SGEs are longer than Message.Remote.Len:
//     fabric.ErrInvalid;
//   - any operation after Close: os.ErrClosed.
//
// Send, Write and Read take all of them; Recv takes the region and bounds
// mistakes, checked against a message that is waiting (a failed Recv
// loses nothing), and no backend limits the SGEs a receive scatters over. RMA over
// Caps.MaxRMASize is not made: a region that large is too costly here.

// mistakeRegion is the size of B's RMA region.
const mistakeRegion = 4096

// mistakeCase is one mistake: the message that makes it and the sentinel
// it must give.
type mistakeCase struct {
	what   string
	msg    fabric.Message
	target error
}

// mistakes returns the SGE mistakes for an operation whose SGEs live in
// reg; big, if not nil, is a region over Caps.MaxMsgSize. For RMA, remote
// is the peer's region, and each message's Remote is as long as its SGEs
// and lies within that region, so that only the SGEs are wrong.
func mistakes(r *role, reg, big *fabric.Region, remote fabric.RemoteIOV) []mistakeCase {
	rma := remote.Len > 0
	msg := func(sges ...fabric.SGE) fabric.Message {
		m := fabric.Message{SGEs: sges}
		if rma {
			m.Remote = remote.Slice(0, uint64(fabric.SGELen(sges)))
		}
		return m
	}
	cs := []mistakeCase{
		{"SGE without a region", msg(fabric.SGE{Length: 1}), fabric.ErrInvalid},
		{"SGE past its region", msg(fabric.SGE{Region: reg, Offset: reg.Len() - 1, Length: 2}), fabric.ErrBounds},
		{"SGE at a negative offset", msg(fabric.SGE{Region: reg, Offset: -1, Length: 2}), fabric.ErrBounds},
	}
	if r.caps.MaxSGEs < mistakeRegion {
		sges := make([]fabric.SGE, r.caps.MaxSGEs+1)
		for i := range sges {
			sges[i] = fabric.SGE{Region: reg, Offset: i, Length: 1}
		}
		cs = append(cs, mistakeCase{"MaxSGEs+1 SGEs", msg(sges...), fabric.ErrMessageSize})
	}
	if rma {
		m := fabric.Message{SGEs: []fabric.SGE{{Region: reg, Length: 128}}, Remote: remote.Slice(0, 64)}
		cs = append(cs, mistakeCase{"SGEs longer than Remote.Len", m, fabric.ErrInvalid})
	} else if big != nil {
		cs = append(cs, mistakeCase{"message over MaxMsgSize", msg(fabric.SGEOf(big)), fabric.ErrMessageSize})
	}
	return cs
}

func mistakesA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	var remote fabric.RemoteIOV
	if r.caps.RMA {
		got, _ := r.recv()
		remote = decodeIOV(t, got)
		if remote.Len != mistakeRegion {
			t.Fatalf("descriptor length %d", remote.Len)
		}
	}
	big := r.alloc(r.caps.MaxMsgSize+1, 0)
	one := []fabric.Message{{}}
	check := func(op string, do func([]fabric.Message) (int, error), c mistakeCase) {
		t.Helper()
		one[0] = c.msg
		n, err := do(one)
		if n != 0 || !errors.Is(err, c.target) {
			t.Errorf("%s with %s = %d, %v; want 0 and an error matching %v", op, c.what, n, err, c.target)
		}
	}
	for _, c := range mistakes(r, r.sbuf, big, fabric.RemoteIOV{}) {
		check("Send", ep.Send, c)
	}
	if r.caps.RMA {
		for _, c := range mistakes(r, r.sbuf, nil, remote) {
			check("Write", ep.Write, c)
		}
		for _, c := range mistakes(r, r.rbuf, nil, remote) {
			check("Read", ep.Read, c)
		}
	}
	// Recv: B's message is waiting (or about to be); each bad receive
	// fails and leaves it there.
	r.send([]byte("mistakes-send"), 0, 0)
	for i, c := range mistakes(r, r.rbuf, nil, fabric.RemoteIOV{}) {
		if c.target == fabric.ErrMessageSize {
			continue // a receive may scatter over any number of SGEs
		}
		one[0] = c.msg
		deadline := time.Now().Add(Timeout)
		for {
			n, err := ep.Recv(one)
			if n == 0 && err == nil && i == 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Microsecond) // not arrived yet
				continue
			}
			if n != 0 || !errors.Is(err, c.target) {
				t.Errorf("Recv with %s = %d, %v; want 0 and an error matching %v", c.what, n, err, c.target)
			}
			break
		}
	}
	if got, _ := r.recv(); string(got) != "mistakes-pending" {
		t.Fatalf("the message after the failed receives: %q, want %q", trunc(got), "mistakes-pending")
	}
	r.send([]byte("mistakes-done"), 0, 0)
	r.expect("mistakes-ok")
	mistakesAfterClose(t, r)
}

// mistakesAfterClose closes the endpoint and checks that every operation
// then fails with os.ErrClosed.
func mistakesAfterClose(t *testing.T, r *role) {
	ep := r.ep
	if err := ep.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	one := []fabric.Message{{SGEs: []fabric.SGE{{Region: r.sbuf, Length: 1}}}}
	type op struct {
		name string
		do   func() error
	}
	ops := []op{
		{"Send", func() error { _, err := ep.Send(one); return err }},
		{"Recv", func() error { _, err := ep.Recv(one); return err }},
		{"SendWait", func() error { _, err := ep.SendWait(r.ctx, one); return err }},
		{"RecvWait", func() error { _, err := ep.RecvWait(r.ctx, one); return err }},
		{"Register", func() error { _, err := ep.Register(make([]byte, 8), 0); return err }},
		{"Alloc", func() error { _, err := ep.Alloc(64, 0); return err }},
		{"CQ().Wait", func() error { _, err := ep.CQ().Wait(r.ctx, make([]fabric.Completion, 1)); return err }},
	}
	if r.caps.RMA {
		ops = append(ops,
			op{"Write", func() error { _, err := ep.Write(one); return err }},
			op{"Read", func() error { _, err := ep.Read(one); return err }})
	}
	if vr, ok := ep.(fabric.ViewReceiver); ok {
		views := make([]fabric.View, 1)
		ops = append(ops,
			op{"RecvViews", func() error { _, err := vr.RecvViews(views); return err }},
			op{"RecvViewsWait", func() error { _, err := vr.RecvViewsWait(r.ctx, views); return err }})
	}
	for _, o := range ops {
		ctx, cancel := context.WithTimeout(r.ctx, Timeout)
		done := make(chan error, 1)
		go func() { done <- o.do() }()
		select {
		case err := <-done:
			if !errors.Is(err, os.ErrClosed) {
				t.Errorf("%s after Close: %v, want an error matching os.ErrClosed", o.name, err)
			}
		case <-ctx.Done():
			t.Errorf("%s after Close blocked", o.name)
		}
		cancel()
	}
}

func mistakesB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	var reg *fabric.Region
	if r.caps.RMA {
		reg = r.alloc(mistakeRegion, fabric.AccessLocalWrite|fabric.AccessRemoteRead|fabric.AccessRemoteWrite)
		copy(reg.Bytes(), pattern(mistakeRegion, 11))
		r.send(encodeIOV(reg.Remote()), 0, 0)
	}
	r.expect("mistakes-send")
	r.send([]byte("mistakes-pending"), 0, 0)
	r.expect("mistakes-done")
	if reg != nil && !bytes.Equal(reg.Bytes(), pattern(mistakeRegion, 11)) {
		t.Errorf("a refused RMA changed the target region at byte %d", firstDiff(reg.Bytes(), pattern(mistakeRegion, 11)))
	}
	r.send([]byte("mistakes-ok"), 0, 0)
}
