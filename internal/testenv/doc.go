// Package testenv holds helpers shared by tests: the privilege gate for tests
// that need root and network namespaces (RequirePrivileged, RequireCommand,
// Unmet, and Partial for a part of a test),
// and leak checks (CheckLeaks: goroutines, file descriptors and named
// network namespaces a test left behind), and what network tests wait and
// talk with: WaitFor (an event a test cannot be told about), Logger (Warn and
// above to the test log), Server (a loopback TCP server running a handler
// per connection, Echo), RoundTrip, Splice (a minimal proxy's copy both
// ways), HTTPOrigin, and Child (a helper process a test
// kills and restarts, talked to over stdin and tagged output lines). It is
// imported only from _test.go files and test helper packages.
package testenv
