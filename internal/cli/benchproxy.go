package cli

import (
	"context"
	"errors"
)

// runBenchProxy is a placeholder until its owner lands it; it fails loudly.
func runBenchProxy(ctx context.Context, env *Env, args []string) error {
	return errors.New("benchproxy: not implemented yet")
}
