// Package pki is the trust model between the mosto controller and its
// proxies: a small certificate authority (ECDSA P-256), the controller's
// server certificate, join tokens (random secret, expiry, stored hashed),
// signing of proxy CSRs into client certificates that name one FEP, the TLS
// configurations for mutual authentication (the join call pins the CA by a
// hash carried in the token, like kubeadm's discovery-token-ca-cert-hash),
// and the overlay HMAC keys used in hop headers (generation and rotation).
//
// It owns the files under DATA/pki and DATA/tokens of a controller data
// directory. It does not serve HTTP and does not know the controller's store:
// tokens go through the TokenStore interface, which a directory
// (DirTokenStore) or the controller's store can implement.
package pki
