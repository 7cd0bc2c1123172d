// Package relaytest builds loopback overlays of relay daemons for tests of
// any package: members on 127.0.0.1 with ephemeral ports, one overlay
// keyring, a chain table, and a test origin. Like wireguard-go's
// tun/tuntest, it is a real implementation (real sockets, real
// relay.Server) made convenient, not a fake.
//
// It uses only relay's exported API. relay's own overlay tests use it from
// package relay_test (relaytest imports relay, so package relay's internal
// tests cannot); the internals they read are exported to them by
// export_test.go. It never touches anything but loopback.
package relaytest
