package cli

import (
	"errors"

	"github.com/mosto-net/mosto/internal/router"
)

// newJoiner returns the handoff's joiner. The kernel translation it needs
// (internal/xlate, issue 14) is not on main yet.
func newJoiner(env *Env) (router.Joiner, error) {
	return nil, errors.New("router: handoff mode needs internal/xlate (issue 14), which is not built into this mosto yet")
}
