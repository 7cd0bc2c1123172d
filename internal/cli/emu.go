package cli

import (
	"context"
	"errors"
)

// runEmu is a placeholder until the emu subcommand lands; it fails loudly.
func runEmu(ctx context.Context, env *Env, args []string) error {
	return errors.New("emu: not implemented yet")
}
