// Package origintest runs an origin.Server on loopback for the tests of
// other packages (clients, proxies and fronts that fetch from it). It is
// imported only from _test.go files.
package origintest
