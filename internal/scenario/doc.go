// Package scenario runs the transfer experiments of `mosto demo` and `mosto
// bench transfer` in an emulated world (internal/emu): it starts an origin
// (internal/origin) on the origin host, a mosto proxy daemon per FEP host
// (`mosto proxy` processes inside the hosts' namespaces), either following a
// real `mosto controller` run on a FEP host (Config.Controller: the proxies
// join over mutual TLS, measure each other and receive their tables; Start
// waits until discovery converged) or given a chain table file computed by
// internal/pathcomp from the world's RTTs, an nginx
// CDN front-end next to the client (internal/cdnfront), and fetches objects
// from the client host in every mode (direct, mosto through a single proxy,
// mosto through the computed chain, CDN warm and cold), measuring each with
// internal/transfer. It reads the proxies' metrics to report the chain each
// flow really took. It owns the processes, files and goroutines it starts;
// the world itself belongs to the caller.
package scenario
