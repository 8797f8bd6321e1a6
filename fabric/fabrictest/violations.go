package fabrictest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
)

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// violation is a remote access that the target must refuse without
// touching memory on either side.
type violation struct {
	name   string
	write  bool
	access fabric.Access // of B's region
	dereg  bool          // B deregisters the region before A's access
	target func(fabric.RemoteIOV) fabric.RemoteIOV
}

const violSize = 4096

var violations = []violation{
	{"WriteWithoutPermission", true, fabric.AccessRemoteRead, false, func(v fabric.RemoteIOV) fabric.RemoteIOV { return v.Slice(0, 256) }},
	{"WriteOutOfBounds", true, fabric.AccessRemoteRead | fabric.AccessRemoteWrite, false, func(v fabric.RemoteIOV) fabric.RemoteIOV { return v.Slice(violSize-56, 256) }},
	{"WriteBeforeRegion", true, fabric.AccessRemoteRead | fabric.AccessRemoteWrite, false, func(v fabric.RemoteIOV) fabric.RemoteIOV {
		return fabric.RemoteIOV{Addr: v.Addr - 64, Len: 256, Key: v.Key}
	}},
	{"WriteWrongKey", true, fabric.AccessRemoteRead | fabric.AccessRemoteWrite, false, func(v fabric.RemoteIOV) fabric.RemoteIOV {
		v = v.Slice(0, 256)
		v.Key ^= 0x5a5a5a00
		return v
	}},
	{"WriteDeregistered", true, fabric.AccessRemoteRead | fabric.AccessRemoteWrite, true, func(v fabric.RemoteIOV) fabric.RemoteIOV { return v.Slice(0, 256) }},
	{"ReadWithoutPermission", false, fabric.AccessRemoteWrite, false, func(v fabric.RemoteIOV) fabric.RemoteIOV { return v.Slice(0, 256) }},
	{"ReadOutOfBounds", false, fabric.AccessRemoteRead | fabric.AccessRemoteWrite, false, func(v fabric.RemoteIOV) fabric.RemoteIOV { return v.Slice(violSize-8, 256) }},
}

// violationCases returns one case per violation, each on a fresh pair:
// after a remote access error a verbs RC queue pair is in the error
// state, so a case checks exactly one.
func violationCases() []Case {
	var cs []Case
	for _, v := range violations {
		cs = append(cs, Case{Name: "Refuse" + v.name,
			A: func(t *testing.T, ep fabric.Endpoint) { violationA(t, ep, v) },
			B: func(t *testing.T, ep fabric.Endpoint) { violationB(t, ep, v) }})
	}
	return cs
}

func violationA(t *testing.T, ep fabric.Endpoint, v violation) {
	r := newRole(t, ep)
	if !r.caps.RMA {
		t.Skip("backend has no RMA")
	}
	got, _ := r.recv()
	remote := v.target(decodeIOV(t, got))
	local := r.alloc(256, fabric.AccessLocalWrite)
	before := pattern(256, 99)
	copy(local.Bytes(), before)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(local)}, Remote: remote, Context: 42}}
	var n int
	var err error
	if v.write {
		n, err = ep.Write(msgs)
	} else {
		n, err = ep.Read(msgs)
	}
	switch {
	case err != nil && errorsIs(err, fabric.ErrAccess):
		// Refused before it was posted: acceptable.
	case err != nil || n != 1:
		t.Fatalf("posting the access = %d, %v", n, err)
	default:
		c := r.wait()
		if c.Context != 42 || c.Status == fabric.StatusOK || !errorsIs(c.Err(), fabric.ErrAccess) {
			t.Fatalf("completion %+v (err %v), want a failure matching ErrAccess", c, c.Err())
		}
	}
	if !bytes.Equal(local.Bytes(), before) {
		t.Errorf("the refused access changed the local buffer at byte %d", firstDiff(local.Bytes(), before))
	}
	// The endpoint may be in an error state now (verbs RC is); try to say
	// we are done, then close: B accepts either.
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{{Region: r.sbuf, Length: copy(r.sbuf.Bytes(), "viol-done")}}}
	ep.Send(msgs)
}

func violationB(t *testing.T, ep fabric.Endpoint, v violation) {
	r := newRole(t, ep)
	if !r.caps.RMA {
		t.Skip("backend has no RMA")
	}
	reg := r.alloc(violSize, fabric.AccessLocalWrite|v.access)
	want := pattern(violSize, 7)
	copy(reg.Bytes(), want)
	desc := reg.Remote()
	if v.dereg {
		if err := reg.Close(); err != nil {
			t.Fatalf("Region.Close: %v", err)
		}
	}
	r.send(encodeIOV(desc), 0, 0)
	done := false
	for !done {
		r.rmsg[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(r.rbuf)}}
		n, err := ep.RecvWait(r.ctx, r.rmsg)
		if err != nil {
			break // the peer closed after an error state
		}
		done = n == 1 && string(r.rbuf.Bytes()[:r.rmsg[0].Len]) == "viol-done"
	}
	if !bytes.Equal(reg.Bytes(), want) {
		t.Fatalf("refused %s changed the target region at byte %d", v.name, firstDiff(reg.Bytes(), want))
	}
}
