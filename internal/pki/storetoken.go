package pki

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/mosto-net/mosto/internal/store"
)

// TokenUser is the token part of the controller's store (internal/store:
// the bbolt and etcd stores implement it). Its records are single use:
// UseToken marks one used atomically, so an HA group of controllers on one
// etcd accepts a token once.
type TokenUser interface {
	PutToken(ctx context.Context, t store.Token) error
	UseToken(ctx context.Context, id string, now time.Time) (store.Token, error)
}

// storeTokenID is the id under which a token is kept in a TokenUser: the
// SHA-256 of "<id>.<secret>", so the store never holds the secret.
func storeTokenID(t Token) string {
	sum := sha256.Sum256([]byte(t.ID + "." + t.Secret))
	return hex.EncodeToString(sum[:])
}

// CreateStoreToken makes a new single-use join token for this CA and keeps
// its record in the controller's store (reusable tokens need a TokenStore).
func (ca *CA) CreateStoreToken(ctx context.Context, st TokenUser, opt TokenOptions) (Token, store.Token, error) {
	if opt.Reusable {
		return Token{}, store.Token{}, errors.New("pki: the controller store keeps single-use tokens only")
	}
	if opt.TTL == 0 {
		opt.TTL = DefaultTokenTTL
	}
	if opt.TTL < 0 {
		return Token{}, store.Token{}, fmt.Errorf("pki: token ttl %v must be positive", opt.TTL)
	}
	if opt.FEP != "" {
		if err := ValidFEPID(opt.FEP); err != nil {
			return Token{}, store.Token{}, fmt.Errorf("pki: %w", err)
		}
	}
	if opt.Now.IsZero() {
		opt.Now = time.Now()
	}
	t, err := ca.newToken()
	if err != nil {
		return Token{}, store.Token{}, err
	}
	rec := store.Token{ID: storeTokenID(t), FEP: opt.FEP, Expires: opt.Now.Add(opt.TTL).UTC()}
	if err := st.PutToken(ctx, rec); err != nil {
		return Token{}, store.Token{}, fmt.Errorf("pki: store token: %w", err)
	}
	return t, rec, nil
}

// errStoreUnknown marks a token the controller store does not know.
var errStoreUnknown = errors.New("pki: token not in the controller store")

// UseStoreToken verifies a join token presented for fepID against the
// controller's store and consumes it. The FEP binding is checked after
// the token is consumed (the store has no read-only lookup): a join with a
// token bound to another FEP burns it. Refusals wrap ErrToken.
func (ca *CA) UseStoreToken(ctx context.Context, st TokenUser, token, fepID string, now time.Time) error {
	return ca.useStoreToken(ctx, st, token, fepID, now, false)
}

// useStoreToken is UseStoreToken; with bound, the token must be bound to
// fepID (a registered id).
func (ca *CA) useStoreToken(ctx context.Context, st TokenUser, token, fepID string, now time.Time, bound bool) error {
	t, err := ParseToken(token)
	if err != nil {
		return err
	}
	if CertHash(ca.Cert) != t.CAHash {
		return fmt.Errorf("%w: token %s was made for another CA", ErrToken, t.ID)
	}
	if now.IsZero() {
		now = time.Now()
	}
	rec, err := st.UseToken(ctx, storeTokenID(t), now)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: %w: token %s", ErrToken, errStoreUnknown, t.ID)
	case errors.Is(err, store.ErrTokenUsed):
		return fmt.Errorf("%w: token %s already used", ErrToken, t.ID)
	case errors.Is(err, store.ErrTokenExpired):
		return fmt.Errorf("%w: token %s expired", ErrToken, t.ID)
	case err != nil:
		return fmt.Errorf("pki: use token %s: %w", t.ID, err)
	}
	if rec.FEP != "" && rec.FEP != fepID {
		return fmt.Errorf("%w: token %s is bound to FEP %q, not %q", ErrToken, t.ID, rec.FEP, fepID)
	}
	if bound && rec.FEP != fepID {
		return fmt.Errorf("%w: %w: token %s is not bound to %q", ErrToken, ErrTokenNotBound, t.ID, fepID)
	}
	return nil
}
