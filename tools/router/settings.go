package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Settings are the knobs of a node that -tune searches, the paper's
// packet-I/O parameters.
type Settings struct {
	// Burst is the most frames taken from a queue or messages sent per
	// call.
	Burst int `json:"burst"`
	// BatchPackets, BatchBytes and BatchDeadline close a batch of the
	// batched back-plane (batch.Options).
	BatchPackets  int      `json:"batch_packets"`
	BatchBytes    int      `json:"batch_bytes"`
	BatchDeadline Duration `json:"batch_deadline"`
	// Spin is the most an idle loop busy-polls before it sleeps: the
	// maximum of Weft's adaptive spin budget (internal/spin), which
	// spins less while spins run out and not at all while the host has
	// more runnable threads than cores. Negative polls without ever
	// sleeping.
	Spin Duration `json:"spin"`
	// Nap is how long an idle loop sleeps at a time once it stops
	// spinning (0: 20µs). Longer naps leave a core to the other
	// processes, at the cost of latency: emulated machines (the
	// Soft-RoCE VMs, one vCPU for a node, its generator and its sink)
	// want that.
	Nap Duration `json:"nap,omitempty"`
	// QueueDepth is the back-plane connections' queue depth
	// (fabric.Options.QueueDepth; 0: the backend's default).
	QueueDepth int `json:"queue_depth"`
	// GSO runs the roce back-plane's engines with UDP GSO and GRO (the
	// address parameter gso=1): runs of equal-size packets to one peer
	// in one system call. Every node must agree; other back-planes
	// ignore it.
	GSO bool `json:"gso,omitempty"`
	// XDP runs the roce back-plane's engines on link=xdp: an AF_XDP
	// socket on the node's veth of each pair instead of UDP sockets, the
	// same RoCEv2 packets without the kernel's UDP path. Other
	// back-planes ignore it.
	XDP bool `json:"xdp,omitempty"`
}

// DefaultSettings are what a run uses without -settings or a tuned file.
var DefaultSettings = Settings{
	Burst:         32,
	BatchPackets:  32,
	BatchBytes:    16 << 10,
	BatchDeadline: Duration(10 * time.Microsecond),
	Spin:          Duration(200 * time.Microsecond),
}

// Duration is a time.Duration that reads and writes JSON as a string
// ("10µs").
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Tuned is the file -tune writes and -settings loads: the best settings
// per back-plane and frame size ("roce+batch/64").
type Tuned map[string]Settings

func tunedKey(bp string, size int) string { return fmt.Sprintf("%s/%d", bp, size) }

// For returns the tuned settings for bp and size, or def.
func (t Tuned) For(bp string, size int, def Settings) Settings {
	if s, ok := t[tunedKey(bp, size)]; ok {
		return s
	}
	return def
}

func loadTuned(path string) (Tuned, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t := Tuned{}
	return t, json.Unmarshal(b, &t)
}

func (t Tuned) save(path string) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// String formats the settings on one line.
func (s Settings) String() string {
	str := fmt.Sprintf("burst=%d batch=%d/%dB/%v spin=%v depth=%d", s.Burst, s.BatchPackets, s.BatchBytes,
		time.Duration(s.BatchDeadline), time.Duration(s.Spin), s.QueueDepth)
	if s.Nap != 0 {
		str += fmt.Sprintf(" nap=%v", time.Duration(s.Nap))
	}
	if s.GSO {
		str += " gso"
	}
	if s.XDP {
		str += " xdp"
	}
	return str
}
