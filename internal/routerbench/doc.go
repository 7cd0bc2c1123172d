// Package routerbench is `mosto bench router`: the request router's
// redirection modes side by side in an emulated world like seed 004's
// (clients behind a linear chain of 1-8 forwarding hosts, a request router,
// two surrogates that are real nginx caches in front of an origin), with
// nginx as an L7 load balancer as the peer. It owns the world it brings up,
// the nginx and router processes it starts in it and their directories.
package routerbench
