package cli

import (
	"context"
	"errors"
)

// runController is a placeholder until the controller subcommand lands; it fails loudly.
func runController(ctx context.Context, env *Env, args []string) error {
	return errors.New("controller: not implemented yet")
}
