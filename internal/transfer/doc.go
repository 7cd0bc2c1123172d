// Package transfer is the measuring HTTP/1.1 client of the benchmarks and the
// demo: it fetches one dynamic object of N bytes from an origin (package
// origin) through whatever first hop it is given — the origin itself, a mosto
// proxy's service listener, an nginx front-end — and measures connect time,
// time to first byte and time to last byte, checking every byte against the
// origin's deterministic stream. A Client either opens a new connection per
// fetch (cold) or keeps one open between fetches (warm). It also parses and
// prints transfer sizes (1 KB = 1000 B, as in the MOSTO paper).
package transfer
