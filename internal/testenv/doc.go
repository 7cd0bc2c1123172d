// Package testenv holds helpers shared by tests: the privilege gate for tests
// that need root and network namespaces, and leak checks. It is imported only
// from _test.go files and test helper packages.
package testenv
