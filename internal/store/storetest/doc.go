// Package storetest is the conformance suite every store.Store
// implementation must pass: call Run from the implementation's tests.
package storetest
