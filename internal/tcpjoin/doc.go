// Package tcpjoin computes how to join two established TCP connections of a
// request router into one session between the client and a surrogate (seed
// 004, formulas 1-4), generalised to connections that already carried data
// in either direction and with SACK, timestamps and window scaling kept
// (the seed stripped them). It is pure arithmetic: Plan turns the state of
// the two connections at the join into one translation Entry per direction,
// and Entry.Apply rewrites a TCP header (seq, ack, SACK blocks, TSval/TSecr,
// window, checksum) the way the kernel's translation (internal/xlate) must,
// so that tests can hold an eBPF program to this reference.
//
// All sequence arithmetic is modulo 2^32 (uint32 wrap-around).
package tcpjoin
