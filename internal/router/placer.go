package router

import (
	"net/netip"

	"github.com/mosto-net/mosto/internal/xlate"
)

// Placer ships one direction of a join to the surrogate's host
// (internal/xagent.Placer).
type Placer interface {
	// Ready reports whether surrogate's host can take an entry now.
	Ready(surrogate netip.Addr) bool
	// Place sends e without waiting; release is called later if the
	// surrogate's host refuses or loses it. False: not sent.
	Place(surrogate netip.Addr, e xlate.Entry, release func()) bool
	// Unplace says the join of in is over.
	Unplace(surrogate netip.Addr, in xlate.Tuple)
}
