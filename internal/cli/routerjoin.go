package cli

import (
	"context"

	"github.com/mosto-net/mosto/internal/router"
	"github.com/mosto-net/mosto/internal/xlate"
)

// newJoiner opens the kernel translation (internal/xlate) on every device
// of this network namespace and returns the handoff's joiner and its
// closer.
func newJoiner(ctx context.Context, env *Env) (*router.XlateJoiner, func(), error) {
	sp, err := xlate.Open(ctx, xlate.Config{Log: env.Log})
	if err != nil {
		return nil, nil, err
	}
	j := &router.XlateJoiner{Splicer: sp}
	return j, func() { j.Wait(); sp.Close() }, nil
}
