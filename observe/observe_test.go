package observe

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

func TestEventLog(t *testing.T) {
	r := NewRegistry("t")
	for i := range DefaultLogSize + 10 {
		r.Record(Event{Source: "s", Kind: "k", Detail: string(rune('a' + i%26))})
	}
	evs, _ := r.Events(0)
	if len(evs) != DefaultLogSize || evs[0].Seq != 11 || evs[len(evs)-1].Seq != DefaultLogSize+10 {
		t.Fatalf("log: %d events, %d..%d", len(evs), evs[0].Seq, evs[len(evs)-1].Seq)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq != evs[i-1].Seq+1 || evs[i].Time.Before(evs[i-1].Time) {
			t.Fatalf("event %d out of order", i)
		}
	}
	if evs, _ := r.Events(DefaultLogSize + 5); len(evs) != 5 {
		t.Fatalf("after: %d events, want 5", len(evs))
	}
}

func TestAddRemove(t *testing.T) {
	r := NewRegistry("t")
	src := SourceFunc(func() Status { return Status{Kind: "x", State: "up"} })
	if err := r.Add("a", src); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("a", src); !errors.Is(err, ErrExists) {
		t.Fatalf("second Add: %v, want ErrExists", err)
	}
	if err := r.Add("", src); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("Add of no name: %v, want ErrInvalid", err)
	}
	r.Remove("a")
	if s := r.Snapshot(); len(s.Sources) != 0 {
		t.Fatalf("%d sources after Remove", len(s.Sources))
	}
}

// TestLongPoll: a watcher waiting in /events?wait= gets an event as soon
// as it is recorded, not at the end of its wait.
func TestLongPoll(t *testing.T) {
	r := NewRegistry("t")
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	type res struct {
		evs []Event
		at  time.Time
		err error
	}
	ch := make(chan res, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/events?after=0&wait=30s")
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer resp.Body.Close()
		var evs []Event
		err = json.NewDecoder(resp.Body).Decode(&evs)
		ch <- res{evs, time.Now(), err}
	}()
	time.Sleep(50 * time.Millisecond) // let the request start waiting (either order passes)
	start := time.Now()
	r.Record(Event{Source: "ep", Kind: "link-down"})
	select {
	case x := <-ch:
		if x.err != nil || len(x.evs) != 1 || x.evs[0].Kind != "link-down" {
			t.Fatalf("got %+v, %v", x.evs, x.err)
		}
		t.Logf("event delivered %v after it was recorded", x.at.Sub(start))
	case <-time.After(20 * time.Second):
		t.Fatal("long poll did not return on the event")
	}
	for _, q := range []string{"/events?after=x", "/events?wait=-1s", "/events?wait=soon"} {
		resp, err := http.Get(srv.URL + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %s, want 400", q, resp.Status)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if evs := r.WaitEvents(ctx, 1); evs != nil {
		t.Fatalf("WaitEvents returned %v with nothing new", evs)
	}
}
