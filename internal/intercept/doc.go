// Package intercept steers TCP flows that cross this host into a local
// transparent listener, without the client or the server being configured
// (seed 002, transparent transmission segmentation).
//
// It owns the nftables TPROXY table and the policy route that deliver the
// flows (Install, Remove, leftover cleanup: one nft transaction per change,
// no leftovers on exit, a restart with the same name replaces a crashed
// run's rules), the IP_TRANSPARENT listener whose accepted connections'
// local address is the flow's original destination (ListenTransparent), and
// the upstream dial that binds the client's address and port
// (DialTransparent), so that the server sees the client and the client sees
// the server. It does not relay bytes: internal/relay does.
//
// Rules are installed in the network namespace of the calling process, or
// of Config.NetNS (ip netns exec). Interception scope: source and
// destination prefixes and destination ports; only a flow's SYN is steered,
// so flows out of scope, flows that existed before Install and replies of
// untouched flows are forwarded as they are. When no listener is there (the
// relay died), a steered SYN either passes untouched (FailOpen, the
// default: nft's tproxy finds no socket and the packet goes on) or is
// refused with a reset (FailClosed). With NoSACK the rules also strip the
// SACK-permitted option from both legs' SYNs (the client's as it is
// steered, the relay's own towards the server in the output hook), so the
// legs detect loss by duplicate ACKs with an adaptive reordering threshold.
// With InitCwnd the relay's own legs start at that congestion window: the
// relay marks their sockets (LegMark, MarkControl) and a policy rule routes
// the marked sockets through a copy of the main table with `initcwnd`; the
// rule and the table go with the rest on Remove and Cleanup.
package intercept
