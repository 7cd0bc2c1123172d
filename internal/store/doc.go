// Package store holds the records the controller persists (FEPs, RTT
// samples, versioned tables, HMAC keys, join tokens, destinations registered
// through the API), the errors its stores share, and the Store interface
// the controller consumes (declared here, as it has two implementations and
// a conformance suite, so none of them imports the controller).
// Implementations: boltstore (one bbolt file, the single-controller default)
// and etcdstore (several controllers with leader election). storetest is the
// conformance suite both pass.
package store
