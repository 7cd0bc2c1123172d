// Package testenv holds helpers shared by tests: the privilege gate for tests
// that need root and network namespaces (RequirePrivileged, RequireCommand),
// and leak checks (CheckLeaks: goroutines, file descriptors and named
// network namespaces a test left behind). It is imported only from _test.go
// files and test helper packages.
package testenv
