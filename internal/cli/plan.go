package cli

import (
	"context"
	"errors"
)

// runPlan is a placeholder until the plan subcommand lands; it fails loudly.
func runPlan(ctx context.Context, env *Env, args []string) error {
	return errors.New("plan: not implemented yet")
}
