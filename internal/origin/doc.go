// Package origin is the HTTP/1.1 origin server of the benchmarks and the
// demo: GET /obj?size=N returns N bytes generated for each request (dynamic
// content, never cacheable) from a deterministic stream, so a client can
// check every byte it receives (see Body and Sum). An optional think time
// delays each response, like an application computing a page. Keep-alive is
// on. The package owns only its listener's connections; it does not set up
// networks or namespaces.
package origin
