// Package hop is the codec of the header that opens every hop connection of a
// mosto chain: a PROXY protocol v2 header (HAProxy's published format)
// carrying the client's original addresses, followed by TLVs in the custom
// range 0xE0-0xEF for the route, the hop index, the final target, the
// transfer-size hint, a flow id and an issue time, closed by an HMAC-SHA256
// TLV over every byte before it.
//
// It owns the wire format (documented byte by byte in docs/hop.md), the
// overlay keyring (two keys valid at once for rotation) and a bounded replay
// cache. It does no network I/O of its own beyond reading exactly one header
// from an io.Reader, never reading past it.
package hop
