package sock

import (
	"context"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

// TestEpochAfterFunc: context.AfterFunc on a deadline's epoch runs the
// function when the deadline passes, not when it was stopped first, and
// at once on an epoch that has fired.
func TestEpochAfterFunc(t *testing.T) {
	var d deadline
	d.init()
	ran := make(chan int, 3)
	stopped := context.AfterFunc(d.ctx(), func() { ran <- 1 })
	context.AfterFunc(d.ctx(), func() { ran <- 2 })
	if !stopped() {
		t.Fatal("stop of a pending AfterFunc reported false")
	}
	if stopped() {
		t.Fatal("second stop reported true")
	}
	d.set(time.Now().Add(-time.Second)) // already past: fires now
	if got := testenv.Recv(t, ran, "the AfterFunc of a deadline that passed"); got != 2 {
		t.Fatalf("ran %d, want the function that was not stopped", got)
	}
	context.AfterFunc(d.ctx(), func() { ran <- 3 }) // a fired epoch
	if got := testenv.Recv(t, ran, "the AfterFunc of a fired epoch"); got != 3 {
		t.Fatalf("ran %d on a fired epoch", got)
	}
	select {
	case got := <-ran:
		t.Fatalf("the stopped function ran (%d)", got)
	default:
	}
}
