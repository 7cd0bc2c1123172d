package cli

import (
	"context"
	"errors"
)

// runDemo is a placeholder until the demo subcommand lands; it fails loudly.
func runDemo(ctx context.Context, env *Env, args []string) error {
	return errors.New("demo: not implemented yet")
}
