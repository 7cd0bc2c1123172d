// Package controller is the reconcile loop of the mosto controller: from the
// registered FEPs and their measured RTTs it computes proxy chains
// (internal/pathcomp) and publishes one versioned table per lookup proxy
// (LoP), restricted to the (InP, EgP) pairs that LoP serves. It computes on
// a period (default 5 min) and at once, after a short debounce, when a FEP
// joins or leaves or an RTT changes significantly. It implements api.Backend.
//
// Several controllers may share one Store (etcdstore): they all serve the
// API from an in-memory cache fed by the store's watch, and only the elected
// leader computes, rotates the hop HMAC keys and writes tables. Versions come
// from the store and only move forward.
//
// It owns no sockets: internal/cli wires it to an HTTP server.
package controller
