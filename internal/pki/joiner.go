package pki

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

// Joiner answers POST /v1/join for the controller API (it implements
// api.Joiner): it verifies the token and signs the CSR with CA. Tokens are
// looked up in Store (the controller's store, for tokens made with
// `mosto token create --etcd`) and then in Tokens (DATA/tokens, for tokens
// made with `mosto token create --data`); either may be nil.
type Joiner struct {
	CA     *CA
	Tokens TokenStore
	Store  TokenUser
	Now    func() time.Time // nil: time.Now
}

var _ api.Joiner = (*Joiner)(nil)

// Join implements api.Joiner. Refused tokens are answered 403; a bad CSR
// wraps api.ErrInvalid (400). A registered id is joined only with a token
// bound to it (ErrTokenNotBound).
func (j *Joiner) Join(ctx context.Context, token string, f api.FEP, csrPEM []byte, registered bool) (api.JoinResponse, error) {
	now := time.Now()
	if j.Now != nil {
		now = j.Now()
	}
	cert, ca, err := j.CA.join(f.ID, csrPEM, now, func() error {
		err := fmt.Errorf("%w: no token store", ErrToken)
		if j.Store != nil {
			err = j.CA.useStoreToken(ctx, j.Store, token, f.ID, now, registered)
			if !errors.Is(err, errStoreUnknown) {
				return err
			}
		}
		if j.Tokens != nil {
			_, err = j.CA.verifyToken(ctx, j.Tokens, token, f.ID, now, registered)
		}
		return err
	})
	if err != nil {
		if errors.Is(err, ErrCSR) {
			return api.JoinResponse{}, fmt.Errorf("%w: %w", api.ErrInvalid, err)
		}
		return api.JoinResponse{}, err
	}
	return api.JoinResponse{CertPEM: string(cert), CAPEM: string(ca)}, nil
}
