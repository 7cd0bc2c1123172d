// Package cdnfront runs a real nginx as a "CDN front-end": a reverse proxy
// placed next to the clients that keeps idle HTTP/1.1 keep-alive connections
// to the origin (as CloudFront does to custom origins) and streams responses
// without buffering them. It renders the nginx configuration, runs nginx in
// the foreground through a command runner (so it can run inside an emulator
// namespace) and stops it. It owns only the nginx processes it starts and the
// directory it writes.
package cdnfront
