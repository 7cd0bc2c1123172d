// Package socks5 is the server side of the SOCKS5 handshake (RFC 1928) with
// no authentication or username/password authentication (RFC 1929), for
// the CONNECT command only. It reads exactly the handshake's bytes, applies
// a destination allowlist hook, and writes replies; dialing the target and
// relaying data belong to the caller (internal/relay).
package socks5
