// Package store holds the records the controller persists (FEPs, RTT
// samples, versioned tables, HMAC keys, join tokens, destinations registered
// through the API) and the errors its stores share. The Store interface
// itself is declared where it is consumed, in internal/controller.
// Implementations: boltstore (one bbolt file, the single-controller default)
// and etcdstore (several controllers with leader election). storetest is the
// conformance suite both pass.
package store
