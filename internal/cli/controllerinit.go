package cli

import (
	"context"
	"errors"
)

// runControllerInit is a placeholder until its owner lands it; it fails loudly.
func runControllerInit(ctx context.Context, env *Env, args []string) error {
	return errors.New("controllerinit: not implemented yet")
}
