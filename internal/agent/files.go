package agent

import (
	"crypto"
	"crypto/x509"
)

// Files of the data directory.
const (
	keyFile   = "fep.key"
	certFile  = "fep.crt"
	caFile    = "ca.crt"
	tableFile = "table.json"
)

func publicKeyMatches(c *x509.Certificate, k crypto.Signer) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := k.Public().(equaler)
	return ok && e.Equal(c.PublicKey)
}
