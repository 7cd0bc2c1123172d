package pki

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

// Joiner answers POST /v1/join for the controller API (it implements
// api.Joiner): it verifies the token against Tokens and signs the CSR with CA.
type Joiner struct {
	CA     *CA
	Tokens TokenStore
	Now    func() time.Time // nil: time.Now
}

var _ api.Joiner = (*Joiner)(nil)

// Join implements api.Joiner. Refused tokens are answered 403; a bad CSR
// wraps api.ErrInvalid (400).
func (j *Joiner) Join(ctx context.Context, token string, f api.FEP, csrPEM []byte) (api.JoinResponse, error) {
	now := time.Now()
	if j.Now != nil {
		now = j.Now()
	}
	cert, ca, err := j.CA.Join(ctx, j.Tokens, token, f.ID, csrPEM, now)
	if err != nil {
		if errors.Is(err, ErrCSR) {
			return api.JoinResponse{}, fmt.Errorf("%w: %w", api.ErrInvalid, err)
		}
		return api.JoinResponse{}, err
	}
	return api.JoinResponse{CertPEM: string(cert), CAPEM: string(ca)}, nil
}
