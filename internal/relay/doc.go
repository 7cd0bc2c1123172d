// Package relay is mosto's data plane: the split-TCP proxy daemon of one FEP
// in every role. As ingress proxy (InP) it accepts flows from its entries
// (service listeners, SOCKS5, HTTP CONNECT), picks the egress proxy (EgP)
// closest to the destination, looks the chain up in its chain table and
// opens a fresh TCP connection to the next hop carrying a signed hop header
// (internal/hop). As transit (TrP) or egress proxy it accepts hop
// connections, verifies the header (authentic, not replayed, addressed to
// this FEP, next hop a member, destination allowed by policy) and either
// forwards it to the next member or connects to the origin. Bytes move with
// io.Copy between *net.TCPConn so the kernel splices them.
//
// It owns configuration (YAML), listeners, limits, timeouts, socket options,
// metrics and drain. It does not parse hop headers or entry protocols itself
// (internal/hop, internal/socks5, internal/httpconnect) and does not compute
// chains (internal/pathcomp).
//
// The code is laid out by stage, each file opening with a comment naming its
// stage: server.go (lifecycle: New, Run, drain), accept.go (listeners,
// accept loop, admission, refusal), handshake.go (handshake workers),
// entry.go (InP entries), hopside.go (hop header verify, forward, exit),
// lookup.go (remote chain lookups), dial.go (dial and pools, with pool.go),
// copy.go (the copy phase), fastpath_linux.go and hoploop_linux.go (the
// event loops, through the unexported loopHandler), admin.go (metrics and
// health HTTP), overlay.go (members, keys and chains set at run time).
package relay
