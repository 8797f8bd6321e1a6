package main

import (
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

// TestPerfCmp runs a short comparison when WEFT_PERF=1 (it is a
// measurement, not a check, and wants an otherwise idle machine).
func TestPerfCmp(t *testing.T) {
	if os.Getenv("WEFT_PERF") != "1" {
		t.Skip("set WEFT_PERF=1 to run the packet-rate comparison")
	}
	testenv.RequireAFXDP(t)
	res, err := Run(Config{Duration: time.Second, Rounds: 3, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + Table(res))
}
