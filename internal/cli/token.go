package cli

import (
	"context"
	"errors"
)

// runToken is a placeholder until the token subcommand lands; it fails loudly.
func runToken(ctx context.Context, env *Env, args []string) error {
	return errors.New("token: not implemented yet")
}
