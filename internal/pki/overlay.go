package pki

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/mosto-net/mosto/internal/atomicfile"
)

// OverlayKeySize is the length of an overlay HMAC secret in bytes.
const OverlayKeySize = 32

// OverlayKey is one hop-header HMAC key: an id byte carried in every header
// (so a receiver knows which key signed it) and a 32-byte secret. The id is
// a function of the secret (KeyID), so the wire format of the controller API
// (the hex secret alone) is enough for every proxy to agree on it.
type OverlayKey struct {
	ID     uint8  `json:"id"`
	Secret []byte `json:"-"`
}

type overlayKeyJSON struct {
	ID     uint8  `json:"id"`
	Secret string `json:"secret"` // hex
}

// MarshalJSON encodes the key as {"id":N,"secret":"<hex>"}.
func (k OverlayKey) MarshalJSON() ([]byte, error) {
	return json.Marshal(overlayKeyJSON{ID: k.ID, Secret: hex.EncodeToString(k.Secret)})
}

// UnmarshalJSON decodes and checks {"id":N,"secret":"<hex>"}.
func (k *OverlayKey) UnmarshalJSON(b []byte) error {
	var j overlayKeyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	key, err := ParseOverlayKey(j.Secret)
	if err != nil {
		return err
	}
	if key.ID != j.ID {
		return fmt.Errorf("overlay key: id %d does not match its secret (want %d)", j.ID, key.ID)
	}
	*k = key
	return nil
}

// KeyID returns the id of the key with the given secret: the first byte of
// SHA-256("mosto overlay key id" || secret).
func KeyID(secret []byte) uint8 {
	h := sha256.New()
	h.Write([]byte("mosto overlay key id"))
	h.Write(secret)
	return h.Sum(nil)[0]
}

// ProbeSecret returns the overlay's probe key under secret: the key of
// RTT probe tags, shared by every FEP (unlike hop headers, which are signed
// per FEP, so a FEP never holds the overlay secret itself).
func ProbeSecret(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("mosto probe key v1"))
	return m.Sum(nil)
}

// Hex returns the secret in hex, the form of the controller API (api.Keys).
func (k OverlayKey) Hex() string { return hex.EncodeToString(k.Secret) }

// ParseOverlayKey decodes a hex secret of OverlayKeySize bytes.
func ParseOverlayKey(h string) (OverlayKey, error) {
	s, err := hex.DecodeString(h)
	if err != nil {
		return OverlayKey{}, fmt.Errorf("overlay key: secret: %w", err)
	}
	if len(s) != OverlayKeySize {
		return OverlayKey{}, fmt.Errorf("overlay key: secret is %d bytes, want %d", len(s), OverlayKeySize)
	}
	return OverlayKey{ID: KeyID(s), Secret: s}, nil
}

// ParseOverlayKeys decodes the hex pair of the controller API (previous may
// be empty).
func ParseOverlayKeys(current, previous string) (OverlayKeys, error) {
	cur, err := ParseOverlayKey(current)
	if err != nil {
		return OverlayKeys{}, fmt.Errorf("current %w", err)
	}
	ks := OverlayKeys{Current: cur}
	if previous != "" {
		prev, err := ParseOverlayKey(previous)
		if err != nil {
			return OverlayKeys{}, fmt.Errorf("previous %w", err)
		}
		ks.Previous = &prev
	}
	if err := ks.Validate(); err != nil {
		return OverlayKeys{}, err
	}
	return ks, nil
}

// OverlayKeys is the key set a controller distributes: headers are signed
// with Current and accepted under Current or Previous, so proxies that
// receive a rotation at different moments keep talking to each other.
type OverlayKeys struct {
	Current  OverlayKey  `json:"current"`
	Previous *OverlayKey `json:"previous,omitempty"`
	Rotated  time.Time   `json:"rotated"` // when Current was made
}

// NewOverlayKey returns a key with a fresh random secret whose id differs
// from every id in avoid.
func NewOverlayKey(avoid ...uint8) (OverlayKey, error) {
	for {
		s := make([]byte, OverlayKeySize)
		if _, err := rand.Read(s); err != nil {
			return OverlayKey{}, fmt.Errorf("pki: overlay key: %w", err)
		}
		k := OverlayKey{ID: KeyID(s), Secret: s}
		if !slices.Contains(avoid, k.ID) {
			return k, nil
		}
	}
}

// NewOverlayKeys returns a first key set (no previous key).
func NewOverlayKeys(now time.Time) (OverlayKeys, error) {
	k, err := NewOverlayKey()
	if err != nil {
		return OverlayKeys{}, err
	}
	return OverlayKeys{Current: k, Rotated: now.UTC()}, nil
}

// Rotate returns the key set after one rotation: a new current key (with an
// id different from the old one's), the old current as previous; the old
// previous is dropped.
func (ks OverlayKeys) Rotate(now time.Time) (OverlayKeys, error) {
	k, err := NewOverlayKey(ks.Current.ID)
	if err != nil {
		return OverlayKeys{}, err
	}
	prev := ks.Current
	return OverlayKeys{Current: k, Previous: &prev, Rotated: now.UTC()}, nil
}

// RotateIfOlder rotates ks when its current key is older than maxAge (a
// maxAge <= 0 never rotates) and reports whether it did.
func (ks OverlayKeys) RotateIfOlder(now time.Time, maxAge time.Duration) (OverlayKeys, bool, error) {
	if maxAge <= 0 || now.Sub(ks.Rotated) < maxAge {
		return ks, false, nil
	}
	n, err := ks.Rotate(now)
	if err != nil {
		return ks, false, err
	}
	return n, true, nil
}

// Validate checks the key set.
func (ks OverlayKeys) Validate() error {
	if len(ks.Current.Secret) != OverlayKeySize {
		return fmt.Errorf("overlay keys: current secret is %d bytes, want %d", len(ks.Current.Secret), OverlayKeySize)
	}
	if ks.Current.ID != KeyID(ks.Current.Secret) {
		return fmt.Errorf("overlay keys: current id %d does not match its secret", ks.Current.ID)
	}
	if p := ks.Previous; p != nil {
		if len(p.Secret) != OverlayKeySize {
			return fmt.Errorf("overlay keys: previous secret is %d bytes, want %d", len(p.Secret), OverlayKeySize)
		}
		if p.ID != KeyID(p.Secret) {
			return fmt.Errorf("overlay keys: previous id %d does not match its secret", p.ID)
		}
		if p.ID == ks.Current.ID {
			return fmt.Errorf("overlay keys: previous and current share id %d", p.ID)
		}
	}
	return nil
}

// OverlayKeysFile is the file, under DATA/pki, where `mosto controller
// init` writes the first key set.
const OverlayKeysFile = "overlay-keys.json"

// SaveOverlayKeys writes ks to path (mode 0600) atomically.
func SaveOverlayKeys(path string, ks OverlayKeys) error {
	if err := ks.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(ks, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(b, '\n'), 0o600)
}

// LoadOverlayKeys reads a key set written by SaveOverlayKeys.
func LoadOverlayKeys(path string) (OverlayKeys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return OverlayKeys{}, fmt.Errorf("pki: %w", err)
	}
	var ks OverlayKeys
	if err := json.Unmarshal(b, &ks); err != nil {
		return OverlayKeys{}, fmt.Errorf("pki: %s: %w", path, err)
	}
	if err := ks.Validate(); err != nil {
		return OverlayKeys{}, fmt.Errorf("pki: %s: %w", path, err)
	}
	return ks, nil
}
