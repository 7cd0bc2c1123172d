package cli

import (
	"context"
	"errors"
)

// runProxy is a placeholder until the proxy subcommand lands; it fails loudly.
func runProxy(ctx context.Context, env *Env, args []string) error {
	return errors.New("proxy: not implemented yet")
}
