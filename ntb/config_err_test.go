package ntb_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// TestConfigErrors: a geometry the bridge cannot hold is refused with
// ErrInvalid, as every backend refuses a bad configuration.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, q := range []string{"ring=4K", "ring=12K&maxmsg=8K", "queues=64"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := fabric.Open(ctx, "ntb", filepath.Join(dir, "b-"+q)+"?"+q, nil)
		cancel()
		if !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", q, err)
		}
	}
}
