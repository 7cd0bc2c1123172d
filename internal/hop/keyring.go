package hop

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"hash"
	"sync"
	"sync/atomic"
)

// Per-FEP signing. A header from FEP a to FEP b (route[hop-1] to
// route[hop]) is signed with the directional pair key
//
//	K(a->b) = HMAC-SHA256(R(b), "mosto hop send v1" 0x00 a)
//	R(b)    = HMAC-SHA256(master, "mosto hop recv v1" 0x00 b)
//
// where master is the overlay secret of the header's key id. The controller
// keeps master; FEP b gets only its receive key R(b) (to verify what any
// sender sends it) and, for each member m it may send to, K(b->m). So a FEP
// can sign only as itself: forging a header from a to b needs R(b) or
// K(a->b), which only b, a and the controller hold. A keyring built from the
// master itself (NewKeyring: static overlays, tests) derives every pair and
// so signs as anyone: such an overlay is one trust domain.

const (
	recvLabel = "mosto hop recv v1\x00"
	sendLabel = "mosto hop send v1\x00"
	// maxCachedPairs bounds the derived keys a keyring keeps (sender ids
	// come from headers not yet authenticated); past it keys are derived
	// per header, correct but two HMACs slower.
	maxCachedPairs = 4096
)

// RecvKey returns FEP id's receive key under the overlay secret master.
func RecvKey(master []byte, id string) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(recvLabel))
	m.Write([]byte(id))
	return m.Sum(nil)
}

// SendKey returns the key of headers from FEP from to the FEP whose receive
// key is recv.
func SendKey(recv []byte, from string) []byte {
	m := hmac.New(sha256.New, recv)
	m.Write([]byte(sendLabel))
	m.Write([]byte(from))
	return m.Sum(nil)
}

// Key is one overlay secret (static overlays and tests): a keyring built
// from it derives every pair's key.
type Key struct {
	ID     uint8
	Secret []byte
}

// FEPKey is what one FEP holds of one key id: its receive key and the send
// keys towards the members it may forward to (member id -> K(self->member)).
type FEPKey struct {
	ID   uint8
	Recv []byte
	Send map[string][]byte
}

// Keyring holds the valid keys: headers are signed with the current one and
// accepted under any (current, previous, and a next key being published).
// It is safe for concurrent use.
type Keyring struct {
	self   string // "" for a keyring built from overlay secrets
	cur    *keyState
	prev   *keyState
	accept []*keyState // accepted, never used to sign
}

// keyState is one key id's material: an overlay secret (master) or one
// FEP's share of it (recv, send).
type keyState struct {
	id     uint8
	master []byte
	recv   []byte
	send   map[string]*pairKey
	cache  sync.Map // master: sender "\x00" receiver -> *pairKey; FEP: sender -> *pairKey
	cached atomic.Int32
}

// pairKey is one directional pair key with a pool of its HMACs.
type pairKey struct{ pool sync.Pool }

func newPairKey(secret []byte) *pairKey {
	s := append([]byte(nil), secret...)
	return &pairKey{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, s) }}}
}

// sum appends HMAC(data) under k to dst.
func (k *pairKey) sum(dst, data []byte) []byte {
	h := k.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(data)
	dst = h.Sum(dst)
	k.pool.Put(h)
	return dst
}

func checkSecret(id uint8, what string, s []byte) error {
	if len(s) < MinSecretLen {
		return fmt.Errorf("hop: key %d: %s of %d bytes, want at least %d", id, what, len(s), MinSecretLen)
	}
	return nil
}

func newMasterState(k Key) (*keyState, error) {
	if err := checkSecret(k.ID, "secret", k.Secret); err != nil {
		return nil, err
	}
	return &keyState{id: k.ID, master: append([]byte(nil), k.Secret...)}, nil
}

func newFEPState(k FEPKey) (*keyState, error) {
	if err := checkSecret(k.ID, "receive key", k.Recv); err != nil {
		return nil, err
	}
	ks := &keyState{id: k.ID, recv: append([]byte(nil), k.Recv...), send: make(map[string]*pairKey, len(k.Send))}
	for peer, s := range k.Send {
		if err := checkID(peer); err != nil {
			return nil, fmt.Errorf("hop: key %d: send key: %w", k.ID, err)
		}
		if err := checkSecret(k.ID, "send key to "+peer, s); err != nil {
			return nil, err
		}
		ks.send[peer] = newPairKey(s)
	}
	return ks, nil
}

// derived returns the cached key under name, or derives it.
func (k *keyState) derived(name string, derive func() []byte) *pairKey {
	if v, ok := k.cache.Load(name); ok {
		return v.(*pairKey)
	}
	pk := newPairKey(derive())
	if k.cached.Load() < maxCachedPairs {
		if v, loaded := k.cache.LoadOrStore(name, pk); loaded {
			return v.(*pairKey)
		}
		k.cached.Add(1)
	}
	return pk
}

// pair returns the key of headers from sender to receiver, or nil when this
// state cannot sign or verify them (self is the keyring's FEP id).
func (k *keyState) pair(self, sender, receiver string, signing bool) *pairKey {
	if k.master != nil {
		return k.derived(sender+"\x00"+receiver, func() []byte { return SendKey(RecvKey(k.master, receiver), sender) })
	}
	if signing {
		if sender != self {
			return nil
		}
		return k.send[receiver]
	}
	if receiver != self {
		return nil
	}
	return k.derived(sender, func() []byte { return SendKey(k.recv, sender) })
}

func newKeyring(self string, cur *keyState, prev *keyState, accept []*keyState) (*Keyring, error) {
	kr := &Keyring{self: self, cur: cur}
	if prev != nil {
		if prev.id == cur.id {
			return nil, fmt.Errorf("hop: previous key has the current key's id %d", cur.id)
		}
		kr.prev = prev
	}
	for _, a := range accept {
		if kr.lookup(a.id) != nil {
			return nil, fmt.Errorf("hop: accepted key id %d is already in the keyring", a.id)
		}
		kr.accept = append(kr.accept, a)
	}
	return kr, nil
}

// NewKeyring returns a keyring of overlay secrets that signs with current
// and also accepts previous (nil for none). The two keys must have
// different ids. It derives every pair's key, so it signs as any FEP.
func NewKeyring(current Key, previous *Key) (*Keyring, error) {
	return NewKeyringAccepting(current, previous)
}

// NewKeyringAccepting returns a keyring of overlay secrets that signs with
// current and accepts current, previous (nil for none) and accept. Every
// id must differ.
func NewKeyringAccepting(current Key, previous *Key, accept ...Key) (*Keyring, error) {
	cur, err := newMasterState(current)
	if err != nil {
		return nil, err
	}
	var prev *keyState
	if previous != nil {
		if prev, err = newMasterState(*previous); err != nil {
			return nil, err
		}
	}
	var acc []*keyState
	for _, a := range accept {
		ks, err := newMasterState(a)
		if err != nil {
			return nil, err
		}
		acc = append(acc, ks)
	}
	return newKeyring("", cur, prev, acc)
}

// NewFEPKeyring returns FEP self's keyring: it signs only headers from self
// (to the members current has a send key for) and verifies only headers to
// self, under current, previous (nil for none) or accept. Every id must
// differ.
func NewFEPKeyring(self string, current FEPKey, previous *FEPKey, accept ...FEPKey) (*Keyring, error) {
	if err := checkID(self); err != nil {
		return nil, fmt.Errorf("hop: keyring of FEP: %w", err)
	}
	cur, err := newFEPState(current)
	if err != nil {
		return nil, err
	}
	var prev *keyState
	if previous != nil {
		if prev, err = newFEPState(*previous); err != nil {
			return nil, err
		}
	}
	var acc []*keyState
	for _, a := range accept {
		ks, err := newFEPState(a)
		if err != nil {
			return nil, err
		}
		acc = append(acc, ks)
	}
	return newKeyring(self, cur, prev, acc)
}

// CurrentID returns the id of the signing key.
func (kr *Keyring) CurrentID() uint8 { return kr.cur.id }

// Self returns the FEP id a keyring of NewFEPKeyring signs as ("" for a
// keyring of overlay secrets).
func (kr *Keyring) Self() string { return kr.self }

func (kr *Keyring) lookup(id uint8) *keyState {
	switch {
	case kr.cur.id == id:
		return kr.cur
	case kr.prev != nil && kr.prev.id == id:
		return kr.prev
	}
	for _, a := range kr.accept {
		if a.id == id {
			return a
		}
	}
	return nil
}

// signer returns the current key of headers from sender to receiver.
func (kr *Keyring) signer(sender, receiver string) (*pairKey, error) {
	if pk := kr.cur.pair(kr.self, sender, receiver, true); pk != nil {
		return pk, nil
	}
	if sender != kr.self {
		return nil, fmt.Errorf("FEP %s cannot sign a header from %s", kr.self, sender)
	}
	return nil, fmt.Errorf("no key %d for headers to %s (not a member this FEP sends to)", kr.cur.id, receiver)
}

// verifier returns key id's key of headers from sender to receiver; errors
// wrap ErrAuth.
func (kr *Keyring) verifier(id uint8, sender, receiver string) (*pairKey, error) {
	ks := kr.lookup(id)
	if ks == nil {
		return nil, fmt.Errorf("%w: unknown key id %d", ErrAuth, id)
	}
	pk := ks.pair(kr.self, sender, receiver, false)
	if pk == nil {
		return nil, fmt.Errorf("%w: a header to %s, not to this FEP (%s)", ErrAuth, receiver, kr.self)
	}
	return pk, nil
}
