package main

import (
	"context"
	"fmt"
)

// Tune is a placeholder replaced below.
func Tune(ctx context.Context, rc RunConfig, path string) error { return fmt.Errorf("tune: not yet") }
