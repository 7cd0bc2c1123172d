// Package evloop relays TCP flows on epoll event loops: each loop is one
// goroutine locked to an OS thread that accepts connections, connects their
// upstream sockets and copies bytes between the two through small buffers,
// with no goroutine per flow and no runtime poller in between. It is the
// fast path for short flows (a request and a reply), where per-connection
// overhead, not bytes, costs the CPU: a flow costs about 14 system calls and
// no context switch of its own.
//
// A flow that turns out to be bulk (one read fills a whole buffer) is handed
// over to the caller (Handler.Handover), which can move it to a zero-copy
// path (splice). What a flow is for (policy, limits, chain choice, headers,
// metrics) is the Handler's business: evloop only owns sockets, buffers,
// half-close, resets and timeouts.
//
// Linux only (epoll, accept4, nonblocking connect).
package evloop
