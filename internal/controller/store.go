package controller

import (
	"context"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// Store is what the controller persists and shares between controllers.
// boltstore and etcdstore implement it; storetest checks both.
type Store interface {
	PutFEP(ctx context.Context, f api.FEP) error
	// DeleteFEP removes a FEP and every RTT from or to it (store.ErrNotFound
	// if there is none).
	DeleteFEP(ctx context.Context, id string) error
	FEPs(ctx context.Context) ([]api.FEP, error) // sorted by id

	// PutDestination registers or replaces a destination registered
	// through the API (d.ID is the key).
	PutDestination(ctx context.Context, d api.Destination) error
	// DeleteDestination removes the destination id and every RTT to it
	// (To == store.DestPrefix+id); store.ErrNotFound if there is none.
	DeleteDestination(ctx context.Context, id string) error
	Destinations(ctx context.Context) ([]api.Destination, error) // sorted by id

	// PutRTTs keeps the newest sample of each (From, To) pair.
	PutRTTs(ctx context.Context, rtts []store.RTT) error
	RTTs(ctx context.Context) ([]store.RTT, error)

	// NextVersion returns a table version greater than any it returned
	// before, across every controller sharing the store.
	NextVersion(ctx context.Context) (uint64, error)
	// PutTables writes the tables whose version is greater than the stored
	// one of their LoP (versions never move backwards) and says how many.
	PutTables(ctx context.Context, ts []store.Table) (int, error)
	// TableVersions returns the stored version of every LoP's table.
	TableVersions(ctx context.Context) (map[string]uint64, error)
	// Tables returns the stored tables of the given LoPs (those that have
	// one), sorted by LoP.
	Tables(ctx context.Context, lops []string) ([]store.Table, error)

	Keys(ctx context.Context) (store.Keys, error) // store.ErrNotFound before the first PutKeys
	PutKeys(ctx context.Context, k store.Keys) error

	// PutRevocation records that a client certificate may no longer act
	// for its FEP (notified as store.ChangeFEPs); Revocations lists them.
	PutRevocation(ctx context.Context, r store.Revocation) error
	Revocations(ctx context.Context) ([]store.Revocation, error)

	PutToken(ctx context.Context, t store.Token) error
	// UseToken atomically marks a token used (store.ErrNotFound,
	// store.ErrTokenUsed, store.ErrTokenExpired).
	UseToken(ctx context.Context, id string, now time.Time) (store.Token, error)

	// Watch sends coalesced notifications of changes made by any controller
	// sharing the store, until ctx is done (then it closes the channel).
	Watch(ctx context.Context) <-chan store.Change
	// Lead blocks until this controller is the leader and returns a context
	// that is cancelled when leadership is lost; cancelling ctx resigns.
	Lead(ctx context.Context) (context.Context, error)
	Close() error
}
