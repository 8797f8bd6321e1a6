// Command rma shows one-sided RMA: a target registers memory with remote
// access and sends its descriptor to an initiator, which then writes into
// that memory and reads from it without the target's CPU taking part. A
// write with immediate data tells the target that the data is there.
//
//	go run ./examples/rma
//
// Both ends run in this process, over an emulated NTB bridge in a
// temporary file (in real use, two processes or two hosts).
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb" // registers "ntb"
)

func main() {
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "rma")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge") // both ends name the same file

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := make(chan fabric.Endpoint)
	go func() { // each end's Open waits for the other
		ep, err := fabric.Open(ctx, "ntb", addr, nil)
		if err != nil {
			log.Fatal(err)
		}
		tc <- ep
	}()
	initiator, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer initiator.Close()
	target := <-tc
	defer target.Close()
	if !initiator.Caps().RMA {
		log.Fatalf("backend %s has no RMA", initiator.Caps().Backend)
	}

	done := make(chan error)
	go func() { done <- runTarget(ctx, target) }()
	if err := runInitiator(ctx, initiator); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
}

// runTarget exposes 4 KiB, sends its descriptor (address, length, key)
// in a message, and waits for the initiator's write.
func runTarget(ctx context.Context, ep fabric.Endpoint) error {
	mem, err := ep.Alloc(4096, fabric.AccessLocalWrite|fabric.AccessRemoteWrite|fabric.AccessRemoteRead)
	if err != nil {
		return err
	}
	copy(mem.Bytes()[1024:], "the target wrote this")
	d := mem.Remote()
	msg, err := ep.Alloc(24, 0)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint64(msg.Bytes()[0:], d.Addr)
	binary.LittleEndian.PutUint64(msg.Bytes()[8:], d.Len)
	binary.LittleEndian.PutUint64(msg.Bytes()[16:], uint64(d.Key))
	if _, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(msg)}}}); err != nil {
		return err
	}

	// The write with immediate arrives as a receive: FlagRemoteWrite,
	// the immediate data, and the length written. No buffer is filled.
	note := []fabric.Message{{}}
	if _, err := ep.RecvWait(ctx, note); err != nil {
		return err
	}
	if note[0].Flags&fabric.FlagRemoteWrite == 0 {
		return fmt.Errorf("expected a write notification, got flags %v", note[0].Flags)
	}
	fmt.Printf("target: notified (imm %#x, %d bytes): %q\n", note[0].Imm, note[0].Len, mem.Bytes()[:note[0].Len])
	return nil
}

// runInitiator receives the descriptor, reads from the target's memory,
// then writes into it with immediate data.
func runInitiator(ctx context.Context, ep fabric.Endpoint) error {
	buf, err := ep.Alloc(4096, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	in := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: 24}}}}
	if _, err := ep.RecvWait(ctx, in); err != nil {
		return err
	}
	remote := fabric.RemoteIOV{
		Addr: binary.LittleEndian.Uint64(buf.Bytes()[0:]),
		Len:  binary.LittleEndian.Uint64(buf.Bytes()[8:]),
		Key:  fabric.Key(binary.LittleEndian.Uint64(buf.Bytes()[16:])),
	}

	// Read 21 bytes at offset 1024. FlagSignal asks for a completion,
	// which says when the data has landed in buf.
	rd := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: 21}},
		Remote: remote.Slice(1024, 21), Flags: fabric.FlagSignal, Context: 1}}
	if _, err := ep.Read(rd); err != nil {
		return err
	}
	if err := wait(ctx, ep); err != nil {
		return err
	}
	fmt.Printf("initiator: read %q\n", buf.Bytes()[:21])

	// Write at offset 0, with immediate data for the target.
	n := copy(buf.Bytes(), "the initiator wrote this")
	wr := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: n}}, Remote: remote.Slice(0, uint64(n)),
		Flags: fabric.FlagImm | fabric.FlagSignal, Imm: 0xCAFE, Context: 2}}
	if _, err := ep.Write(wr); err != nil {
		return err
	}
	return wait(ctx, ep)
}

// wait waits for one completion and returns its error: a refused access
// (wrong key, no permission, out of bounds) fails here with ErrAccess.
func wait(ctx context.Context, ep fabric.Endpoint) error {
	c := make([]fabric.Completion, 1)
	if _, err := ep.CQ().Wait(ctx, c); err != nil {
		return err
	}
	return c[0].Err()
}
