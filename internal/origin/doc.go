// Package origin is the HTTP/1.1 origin server of the benchmarks and the
// demo: GET /obj?size=N returns N bytes generated for each request (dynamic
// content, never cacheable) from a deterministic stream, so a client can
// check every byte it receives (see Body, BodyAt and Sum). An optional think
// time delays each response, like an application computing a page.
// Keep-alive is on. Single byte ranges (206, Content-Range, 416) and If-Range
// are served, with an ETag that names (seed, size) and a fixed Last-Modified,
// so several origins are mirrors of one object. For tests and benchmarks a
// server can be told to go silent for a while (Silence) or to cap its rate
// (SetRate, Config.Rate). The package owns only its listener's connections;
// it does not set up networks or namespaces.
package origin
