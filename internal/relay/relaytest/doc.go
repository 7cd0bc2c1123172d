// Package relaytest builds loopback overlays of relay daemons for tests of
// any package: members on 127.0.0.1 with ephemeral ports, one overlay
// keyring, a chain table, and a test origin. Like wireguard-go's
// tun/tuntest, it is a real implementation (real sockets, real
// relay.Server) made convenient, not a fake.
//
// It uses only relay's exported API, so tests inside package relay (which
// need its internals) cannot import it (an import cycle); they keep their
// own world in helpers_test.go. It never touches anything but loopback.
package relaytest
