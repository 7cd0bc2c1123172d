package cli

import (
	"context"
	"errors"
)

// runBenchTransfer is a placeholder until its owner lands it; it fails loudly.
func runBenchTransfer(ctx context.Context, env *Env, args []string) error {
	return errors.New("benchtransfer: not implemented yet")
}
