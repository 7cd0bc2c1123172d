package store

import (
	"errors"
	"time"
)

// Errors shared by every store.
var (
	ErrNotFound     = errors.New("store: not found")
	ErrTokenUsed    = errors.New("store: token already used")
	ErrTokenExpired = errors.New("store: token expired")
	ErrClosed       = errors.New("store: closed")
)

// RTT is the latest round-trip time measured from one FEP to another, or,
// with Unreachable set (and MS 0), the report that From could not reach To
// for several probe rounds. Like any sample, a newer one replaces it.
type RTT struct {
	From        string    `json:"from"`
	To          string    `json:"to"`
	MS          float64   `json:"ms"`
	At          time.Time `json:"at"`
	Unreachable bool      `json:"unreachable,omitempty"`
}

// Table is the encoded chain table of one LoP at a version. Data is opaque to
// the store (the controller keeps gzip-compressed JSON there).
type Table struct {
	LoP     string
	Version uint64
	Data    []byte
}

// Keys are the hop-header HMAC keys (raw bytes, hex on the wire). A
// rotation has two phases: Next is published (proxies accept it, nobody
// signs with it), then, once every LoP has it, it becomes Current.
type Keys struct {
	Current  []byte    `json:"current"`
	Previous []byte    `json:"previous,omitempty"`
	Rotated  time.Time `json:"rotated"`
	Next     []byte    `json:"next,omitempty"`
	NextAt   time.Time `json:"next_at,omitzero"` // when Next was published
	// Epoch names this store's life: made with the first key, it changes
	// when the store is replaced (lost, or moved from bbolt to etcd), and
	// proxies then follow the new table versions whatever their number.
	Epoch string `json:"epoch,omitempty"`
}

// Token is a join token record. ID is what the store indexes (the caller may
// store a hash of the secret there rather than the secret).
type Token struct {
	ID      string    `json:"id"`
	FEP     string    `json:"fep,omitempty"` // if set, the token may only join this FEP id
	Expires time.Time `json:"expires"`
	Used    bool      `json:"used"`
}

// Revocation is a client certificate that may no longer act for its FEP
// (the FEP was deleted, or re-joined with a new key).
type Revocation struct {
	Serial string    `json:"serial"` // hex
	FEP    string    `json:"fep"`
	At     time.Time `json:"at"`
}

// Change tells watchers which kinds of records changed.
type Change uint8

// Kinds of changes.
const (
	ChangeFEPs Change = 1 << iota
	ChangeRTTs
	ChangeTables
	ChangeKeys
	ChangeDests // destinations registered through the API
	// Revocations are published as ChangeFEPs.
)

// DestPrefix marks the RTT records to destinations: a FEP's RTT to the
// destination d is the record (FEP, DestPrefix+d). "@" is never in a FEP id,
// so these records never mix with FEP-to-FEP RTTs; DeleteDestination
// removes them with the destination and DeleteFEP with the FEP.
const DestPrefix = "@"
