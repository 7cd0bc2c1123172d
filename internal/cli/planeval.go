package cli

import (
	"context"
	"errors"
)

// runPlanEval is a placeholder until its owner lands it; it fails loudly.
func runPlanEval(ctx context.Context, env *Env, args []string) error {
	return errors.New("planeval: not implemented yet")
}
