// Package storetest is the conformance suite every controller.Store
// implementation must pass: call Run from the implementation's tests.
package storetest
