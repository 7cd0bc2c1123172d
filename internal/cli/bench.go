package cli

import (
	"context"
	"errors"
)

// runBench is a placeholder until the bench subcommand lands; it fails loudly.
func runBench(ctx context.Context, env *Env, args []string) error {
	return errors.New("bench: not implemented yet")
}
