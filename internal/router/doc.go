// Package router is mosto's HTTP/1.1 request router (seed 004, "Transparent
// Redirections in Content Delivery Networks"): it accepts a client's TCP
// session, reads one request head with strict limits, picks a surrogate by
// the client's location, the URL (consistent hashing) and load, and then
// redirects the client in one of four ways:
//
//   - ModeRedirect: an HTTP 302 to the surrogate (the client opens a second
//     connection and repeats the request);
//   - ModeProxy: the router forwards the bytes over a pre-established
//     connection to the surrogate and relays the session (an L7 front);
//   - ModeHandoff: the router sends the request over a pre-established
//     connection and hands the client's TCP session to the surrogate through
//     a Joiner (seq/ack/option translation in the kernel, internal/xlate);
//   - DNS: a small authoritative responder (DNSServer) answers the nearest
//     surrogate's address, and the client connects to it directly.
//
// A session stays with the surrogate chosen for its first request: further
// (pipelined or keep-alive) requests on a proxied or handed-off connection
// are served by the same surrogate. An invalid request gets a 400 and the
// connection is closed; a client that does not complete its request head
// within the header timeout (slowloris) gets a 408.
//
// The package owns the connections it accepts and dials and the goroutines
// serving them (all stopped by the context given to Serve); it does not set
// up namespaces, routes or eBPF programs.
package router
