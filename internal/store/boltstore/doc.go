// Package boltstore is the embedded default store of the controller: one
// bbolt file in the data directory, for a single controller (bbolt locks the
// file, so a second controller on the same directory fails to open it). Lead
// returns at once: the only controller is the leader.
package boltstore
