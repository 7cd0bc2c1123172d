package pki

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/atomicfile"
)

// Token errors. Every refusal of a join token wraps ErrToken, so an API
// handler maps them all to one status (403) without telling an attacker
// which part was wrong; the wrapped text is for the controller's log.
var (
	ErrToken        = errors.New("pki: join token refused")
	ErrTokenUnknown = errors.New("pki: unknown token")
)

// tokenPrefix starts every join token; it makes tokens recognisable in
// logs and secret scanners.
const tokenPrefix = "mosto1"

// Token is a parsed join token:
//
//	mosto1.<id>.<secret>.<ca-hash>
//
// id is 12 hex digits (it names the stored record), secret 32 hex digits
// (128 random bits, stored only as its SHA-256), ca-hash the 64 hex digits
// of the SHA-256 of the CA's SubjectPublicKeyInfo, which the joining proxy
// uses to authenticate the controller before sending anything.
type Token struct {
	ID     string
	Secret string
	CAHash string // "sha256:<hex>"
}

// String returns the token in its printed form.
func (t Token) String() string {
	return tokenPrefix + "." + t.ID + "." + t.Secret + "." + strings.TrimPrefix(t.CAHash, "sha256:")
}

// ParseToken parses the printed form of a token.
func ParseToken(s string) (Token, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 4 || parts[0] != tokenPrefix {
		return Token{}, fmt.Errorf("%w: malformed token (want %s.<id>.<secret>.<ca-hash>)", ErrToken, tokenPrefix)
	}
	t := Token{ID: parts[1], Secret: parts[2], CAHash: "sha256:" + parts[3]}
	for _, f := range []struct {
		name string
		val  string
		n    int
	}{{"id", t.ID, 12}, {"secret", t.Secret, 32}, {"ca hash", parts[3], 64}} {
		if len(f.val) != f.n || !isLowerHex(f.val) {
			return Token{}, fmt.Errorf("%w: malformed token %s (want %d lowercase hex digits)", ErrToken, f.name, f.n)
		}
	}
	return t, nil
}

func isLowerHex(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// TokenRecord is what a controller stores about a token: never the secret,
// only its hash.
type TokenRecord struct {
	ID         string    `json:"id"`
	SecretHash string    `json:"secret_sha256"` // hex
	Expires    time.Time `json:"expires"`
	FEP        string    `json:"fep,omitempty"` // when set, only this FEP id may join with it
	Reusable   bool      `json:"reusable,omitempty"`
	Created    time.Time `json:"created"`
}

// TokenStore keeps token records. DeleteToken must fail with an error
// wrapping ErrTokenUnknown when the record is already gone: that makes a
// single-use token usable once even when two joins race.
type TokenStore interface {
	PutToken(ctx context.Context, rec TokenRecord) error
	GetToken(ctx context.Context, id string) (TokenRecord, error)
	DeleteToken(ctx context.Context, id string) error
}

// TokenOptions are the properties of a new token.
type TokenOptions struct {
	TTL      time.Duration // 0 means 24h
	FEP      string        // bind the token to one FEP id; empty = any id
	Reusable bool          // usable until expiry rather than once
	Now      time.Time     // zero means time.Now()
}

// DefaultTokenTTL is the lifetime of a token created without a TTL.
const DefaultTokenTTL = 24 * time.Hour

// CreateToken makes a new join token for this CA and stores its record.
func (ca *CA) CreateToken(ctx context.Context, store TokenStore, opt TokenOptions) (Token, TokenRecord, error) {
	if opt.TTL == 0 {
		opt.TTL = DefaultTokenTTL
	}
	if opt.TTL < 0 {
		return Token{}, TokenRecord{}, fmt.Errorf("pki: token ttl %v must be positive", opt.TTL)
	}
	if opt.FEP != "" {
		if err := ValidFEPID(opt.FEP); err != nil {
			return Token{}, TokenRecord{}, fmt.Errorf("pki: %w", err)
		}
	}
	if opt.Now.IsZero() {
		opt.Now = time.Now()
	}
	t, err := ca.newToken()
	if err != nil {
		return Token{}, TokenRecord{}, err
	}
	rec := TokenRecord{
		ID:         t.ID,
		SecretHash: hashSecret(t.Secret),
		Expires:    opt.Now.Add(opt.TTL).UTC(),
		FEP:        opt.FEP,
		Reusable:   opt.Reusable,
		Created:    opt.Now.UTC(),
	}
	if err := store.PutToken(ctx, rec); err != nil {
		return Token{}, TokenRecord{}, fmt.Errorf("pki: store token: %w", err)
	}
	return t, rec, nil
}

// newToken returns a token with a fresh id and secret for this CA.
func (ca *CA) newToken() (Token, error) {
	var raw [6 + 16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Token{}, fmt.Errorf("pki: token: %w", err)
	}
	return Token{ID: hex.EncodeToString(raw[:6]), Secret: hex.EncodeToString(raw[6:]), CAHash: ca.Hash()}, nil
}

func hashSecret(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// VerifyToken checks a join token presented for fepID: well formed, made
// for this CA, known, secret matching (constant time), not expired, bound to
// fepID if bound at all. A single-use token is consumed by a successful
// verification. Every refusal wraps ErrToken.
func (ca *CA) VerifyToken(ctx context.Context, store TokenStore, token, fepID string, now time.Time) (TokenRecord, error) {
	return ca.verifyToken(ctx, store, token, fepID, now, false)
}

// ErrTokenNotBound is wrapped (with ErrToken) by the refusal of a join of a
// registered FEP id with a token not bound to that id.
var ErrTokenNotBound = errors.New("pki: the FEP id is registered; only a token bound to it (--fep ID) may join it again")

// verifyToken is VerifyToken; with bound, the token must be bound to fepID
// (the id is registered: a reusable or unbound token never takes it over),
// checked before a single-use token is consumed.
func (ca *CA) verifyToken(ctx context.Context, store TokenStore, token, fepID string, now time.Time, bound bool) (TokenRecord, error) {
	t, err := ParseToken(token)
	if err != nil {
		return TokenRecord{}, err
	}
	if subtle.ConstantTimeCompare([]byte(t.CAHash), []byte(ca.Hash())) != 1 {
		return TokenRecord{}, fmt.Errorf("%w: token %s was made for another CA", ErrToken, t.ID)
	}
	rec, err := store.GetToken(ctx, t.ID)
	if err != nil {
		if errors.Is(err, ErrTokenUnknown) {
			return TokenRecord{}, fmt.Errorf("%w: token %s unknown or already used", ErrToken, t.ID)
		}
		return TokenRecord{}, fmt.Errorf("pki: load token %s: %w", t.ID, err)
	}
	if subtle.ConstantTimeCompare([]byte(hashSecret(t.Secret)), []byte(rec.SecretHash)) != 1 {
		return TokenRecord{}, fmt.Errorf("%w: token %s: wrong secret", ErrToken, t.ID)
	}
	if now.IsZero() {
		now = time.Now()
	}
	if !now.Before(rec.Expires) {
		return TokenRecord{}, fmt.Errorf("%w: token %s expired at %s", ErrToken, t.ID, rec.Expires.Format(time.RFC3339))
	}
	if rec.FEP != "" && rec.FEP != fepID {
		return TokenRecord{}, fmt.Errorf("%w: token %s is bound to FEP %q, not %q", ErrToken, t.ID, rec.FEP, fepID)
	}
	if bound && rec.FEP != fepID {
		return TokenRecord{}, fmt.Errorf("%w: %w: token %s is not bound to %q", ErrToken, ErrTokenNotBound, t.ID, fepID)
	}
	if !rec.Reusable {
		if err := store.DeleteToken(ctx, t.ID); err != nil {
			if errors.Is(err, ErrTokenUnknown) {
				return TokenRecord{}, fmt.Errorf("%w: token %s already used", ErrToken, t.ID)
			}
			return TokenRecord{}, fmt.Errorf("pki: consume token %s: %w", t.ID, err)
		}
	}
	return rec, nil
}

// Join verifies a join token for fepID and signs the proxy's CSR: the
// whole of POST /v1/join behind the HTTP layer. It returns the client
// certificate and the CA certificate (PEM). Refused tokens wrap ErrToken
// (answer 403), bad requests wrap ErrCSR (answer 400).
func (ca *CA) Join(ctx context.Context, store TokenStore, token, fepID string, csrPEM []byte, now time.Time) (certPEM, caPEM []byte, err error) {
	return ca.join(fepID, csrPEM, now, func() error {
		_, err := ca.VerifyToken(ctx, store, token, fepID, now)
		return err
	})
}

// join checks the request, runs verify (which consumes the token) and
// signs the CSR.
func (ca *CA) join(fepID string, csrPEM []byte, now time.Time, verify func() error) (certPEM, caPEM []byte, err error) {
	if err := ValidFEPID(fepID); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrCSR, err)
	}
	if fepID == api.AdminIdentity {
		return nil, nil, fmt.Errorf("%w: FEP id %q is reserved for the operator's certificate", ErrCSR, fepID)
	}
	// Check the CSR before consuming a single-use token on it.
	if _, err := parseCSR(csrPEM); err != nil {
		return nil, nil, err
	}
	if err := verify(); err != nil {
		return nil, nil, err
	}
	certPEM, err = ca.SignCSR(csrPEM, fepID, now)
	if err != nil {
		return nil, nil, err
	}
	return certPEM, ca.PEM(), nil
}

// DirTokenStore keeps one JSON file per token in a directory
// (DATA/tokens/<id>.json, mode 0600). Deleting uses unlink, which succeeds
// for exactly one of several racing callers.
type DirTokenStore struct {
	Dir string
}

// TokenDir returns the token directory of a controller data directory.
func TokenDir(dataDir string) string { return filepath.Join(dataDir, "tokens") }

func (s DirTokenStore) path(id string) (string, error) {
	if len(id) != 12 || !isLowerHex(id) {
		return "", fmt.Errorf("%w: bad id %q", ErrTokenUnknown, id)
	}
	return filepath.Join(s.Dir, id+".json"), nil
}

// PutToken writes rec.
func (s DirTokenStore) PutToken(ctx context.Context, rec TokenRecord) error {
	p, err := s.path(rec.ID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("token dir: %w", err)
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(p, append(b, '\n'), 0o600)
}

// GetToken reads the record of id.
func (s DirTokenStore) GetToken(ctx context.Context, id string) (TokenRecord, error) {
	p, err := s.path(id)
	if err != nil {
		return TokenRecord{}, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return TokenRecord{}, fmt.Errorf("%w: %s", ErrTokenUnknown, id)
	}
	if err != nil {
		return TokenRecord{}, err
	}
	var rec TokenRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return TokenRecord{}, fmt.Errorf("token %s: %w", id, err)
	}
	if rec.ID != id {
		return TokenRecord{}, fmt.Errorf("token file %s holds id %q", p, rec.ID)
	}
	return rec, nil
}

// DeleteToken removes the record of id.
func (s DirTokenStore) DeleteToken(ctx context.Context, id string) error {
	p, err := s.path(id)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %s", ErrTokenUnknown, id)
		}
		return err
	}
	return nil
}

// PruneTokens deletes expired records and returns how many it removed.
func (s DirTokenStore) PruneTokens(ctx context.Context, now time.Time) (int, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		rec, err := s.GetToken(ctx, id)
		if err != nil || now.Before(rec.Expires) {
			continue
		}
		if s.DeleteToken(ctx, id) == nil {
			n++
		}
	}
	return n, nil
}
