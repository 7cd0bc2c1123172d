package pki

import (
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// ServerTLSConfig returns the TLS configuration of the controller's API:
// TLS 1.3, the server certificate (sent with the CA so joining proxies can
// match their token's pin), and client certificates verified against the
// CA when given. The TLS layer cannot know the URL, so it accepts
// connections without a client certificate (a proxy that is joining has
// none yet); wrap the handler in RequireClientCert to refuse every other
// request that lacks one.
func (ca *CA) ServerTLSConfig() (*tls.Config, error) {
	if len(ca.server.Certificate) == 0 {
		return nil, errors.New("pki: no server certificate loaded")
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{ca.server},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.Pool(),
	}, nil
}

// RefuseRevoked makes cfg (a ServerTLSConfig) refuse at the handshake a
// client certificate whose serial (hex) revoked reports as revoked.
func RefuseRevoked(cfg *tls.Config, revoked func(serial string) bool) {
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) > 0 && revoked(cs.PeerCertificates[0].SerialNumber.Text(16)) {
			return fmt.Errorf("pki: client certificate %s is revoked", cs.PeerCertificates[0].SerialNumber.Text(16))
		}
		return nil
	}
}

// RequireClientCert wraps h so that every request except those for which
// exempt returns true (POST /v1/join, GET /healthz) must carry a verified FEP
// client certificate; others get 401 with a JSON error body.
func RequireClientCert(h http.Handler, exempt func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exempt != nil && exempt(r) {
			h.ServeHTTP(w, r)
			return
		}
		if _, err := FEPFromRequest(r); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(map[string]string{"error": "client certificate required: " + err.Error()})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// ClientTLSConfig returns the TLS configuration of a proxy talking to the
// controller after it joined: it trusts only the controller's CA (caPEM)
// and presents its FEP certificate.
func ClientTLSConfig(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	ca, err := ParseCertPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: client key pair: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		RootCAs:      pool,
		Certificates: []tls.Certificate{pair},
	}, nil
}

// JoinTLSConfig returns the TLS configuration of a proxy's join call: it
// has no CA yet, so it looks in the server's certificate chain for a CA
// whose public key hash equals caHash (from the token) and verifies the
// server certificate against that CA and the server name. A controller
// impostor cannot produce such a chain, so the join is not trust on first
// use.
func JoinTLSConfig(caHash string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Verification is done by VerifyConnection below, against the pinned CA.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs, caHash)
		},
	}
}

// ErrPin is wrapped by the errors of a join call whose server does not
// prove it holds the CA the token pins.
var ErrPin = errors.New("pki: controller does not match the token's CA pin")

func verifyPinned(cs tls.ConnectionState, caHash string) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: no server certificate", ErrPin)
	}
	var ca *x509.Certificate
	for _, c := range cs.PeerCertificates[1:] {
		if c.IsCA && subtle.ConstantTimeCompare([]byte(CertHash(c)), []byte(caHash)) == 1 {
			ca = c
			break
		}
	}
	if ca == nil {
		return fmt.Errorf("%w: server chain has no CA with hash %s", ErrPin, caHash)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots:     roots,
		DNSName:   cs.ServerName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("%w: server certificate not valid under the pinned CA: %w", ErrPin, err)
	}
	return nil
}

// CheckCAPin reports whether caPEM (returned by a join) is the CA a
// token pins.
func CheckCAPin(caPEM []byte, caHash string) error {
	c, err := ParseCertPEM(caPEM)
	if err != nil {
		return fmt.Errorf("pki: CA certificate: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(CertHash(c)), []byte(caHash)) != 1 {
		return fmt.Errorf("%w: CA %s is not %s", ErrPin, CertHash(c), caHash)
	}
	return nil
}
