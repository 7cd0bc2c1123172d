package store

import (
	"context"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

// Store is what the controller persists and shares between controllers.
// boltstore and etcdstore implement it; storetest checks both. It is
// declared here, beside its types, so the implementations and their
// conformance suite need not import the controller.
type Store interface {
	PutFEP(ctx context.Context, f api.FEP) error
	// DeleteFEP removes a FEP and every RTT from or to it (ErrNotFound
	// if there is none).
	DeleteFEP(ctx context.Context, id string) error
	FEPs(ctx context.Context) ([]api.FEP, error) // sorted by id

	// PutDestination registers or replaces a destination registered
	// through the API (d.ID is the key).
	PutDestination(ctx context.Context, d api.Destination) error
	// DeleteDestination removes the destination id and every RTT to it
	// (To == DestPrefix+id); ErrNotFound if there is none.
	DeleteDestination(ctx context.Context, id string) error
	Destinations(ctx context.Context) ([]api.Destination, error) // sorted by id

	// PutRTTs keeps the newest sample of each (From, To) pair.
	PutRTTs(ctx context.Context, rtts []RTT) error
	RTTs(ctx context.Context) ([]RTT, error)

	// NextVersion returns a table version greater than any it returned
	// before, across every controller sharing the
	NextVersion(ctx context.Context) (uint64, error)
	// PutTables writes the tables whose version is greater than the stored
	// one of their LoP (versions never move backwards) and says how many.
	PutTables(ctx context.Context, ts []Table) (int, error)
	// TableVersions returns the stored version of every LoP's table.
	TableVersions(ctx context.Context) (map[string]uint64, error)
	// Tables returns the stored tables of the given LoPs (those that have
	// one), sorted by LoP.
	Tables(ctx context.Context, lops []string) ([]Table, error)

	Keys(ctx context.Context) (Keys, error) // ErrNotFound before the first PutKeys
	PutKeys(ctx context.Context, k Keys) error

	// PutRevocation records that a client certificate may no longer act
	// for its FEP (notified as ChangeFEPs); Revocations lists them.
	PutRevocation(ctx context.Context, r Revocation) error
	Revocations(ctx context.Context) ([]Revocation, error)

	PutToken(ctx context.Context, t Token) error
	// UseToken atomically marks a token used (ErrNotFound,
	// ErrTokenUsed, ErrTokenExpired).
	UseToken(ctx context.Context, id string, now time.Time) (Token, error)

	// Watch sends coalesced notifications of changes made by any controller
	// sharing the store, until ctx is done (then it closes the channel).
	Watch(ctx context.Context) <-chan Change
	// Lead blocks until this controller is the leader and returns a context
	// that is cancelled when leadership is lost; cancelling ctx resigns.
	Lead(ctx context.Context) (context.Context, error)
	Close() error
}
