package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/atomicfile"
)

// ErrCSR marks a certificate signing request that cannot be signed (bad
// PEM, bad signature, unsupported key): a client error.
var ErrCSR = errors.New("pki: bad certificate request")

// ErrNoIdentity is returned when a request carries no verified FEP
// client certificate.
var ErrNoIdentity = errors.New("pki: no verified FEP client certificate")

// ErrWrongFEP is returned when a verified client certificate names another FEP.
var ErrWrongFEP = errors.New("pki: client certificate names another FEP")

// fepURIScheme and fepURIHost form the URI SAN of a FEP certificate:
// mosto://fep/<id>.
const (
	fepURIScheme = "mosto"
	fepURIHost   = "fep"
)

// ValidFEPID reports whether id can name a FEP: 1 to 64 characters from
// [A-Za-z0-9._-], not starting with a dot. Table location names are FEP
// ids, so the same rule keeps them printable and path-safe.
func ValidFEPID(id string) error {
	if len(id) == 0 || len(id) > 64 {
		return fmt.Errorf("FEP id %q: length must be 1..64", id)
	}
	if id[0] == '.' {
		return fmt.Errorf("FEP id %q: must not start with a dot", id)
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("FEP id %q: character %q not allowed (use A-Z a-z 0-9 . _ -)", id, c)
		}
	}
	return nil
}

// GenerateKey returns a new ECDSA P-256 key in PKCS#8 PEM form.
func GenerateKey() (crypto.Signer, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: generate key: %w", err)
	}
	b, err := marshalKey(k)
	if err != nil {
		return nil, nil, err
	}
	return k, b, nil
}

// ParseKeyPEM parses a PKCS#8 or SEC1 private key.
func ParseKeyPEM(b []byte) (crypto.Signer, error) {
	k, err := parseKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("pki: parse key: %w", err)
	}
	return k, nil
}

// NewCSR returns a PEM certificate request for fepID signed by key.
func NewCSR(key crypto.Signer, fepID string) ([]byte, error) {
	if err := ValidFEPID(fepID); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: fepID},
		URIs:    []*url.URL{fepURI(fepID)},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CSR: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

func fepURI(id string) *url.URL {
	return &url.URL{Scheme: fepURIScheme, Host: fepURIHost, Path: "/" + id}
}

// SignCSR signs a proxy's certificate request into a client certificate
// for fepID, whatever names the request asks for: the identity comes from
// the (verified) join token, not from the request. The certificate is valid
// for FEPValidity (capped by the CA's own expiry), has the FEP id as common
// name and as URI SAN mosto://fep/<id>, and may only authenticate clients.
func (ca *CA) SignCSR(csrPEM []byte, fepID string, now time.Time) ([]byte, error) {
	if fepID == api.AdminIdentity {
		return nil, fmt.Errorf("%w: FEP id %q is reserved for the operator's certificate", ErrCSR, fepID)
	}
	return ca.signClient(csrPEM, fepID, now)
}

// signClient signs a client certificate for id (a FEP id or the admin).
func (ca *CA) signClient(csrPEM []byte, fepID string, now time.Time) ([]byte, error) {
	if err := ValidFEPID(fepID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCSR, err)
	}
	csr, err := parseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	if now.IsZero() {
		now = time.Now()
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: fepID, Organization: []string{"mosto fep"}},
		URIs:         []*url.URL{fepURI(fepID)},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     minTime(now.Add(FEPValidity), ca.Cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign certificate for %s: %w", fepID, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// FEPFromCert returns the FEP id a certificate issued by SignCSR names. It
// does not verify the chain: use it on verified certificates only.
func FEPFromCert(c *x509.Certificate) (string, error) {
	var id string
	for _, u := range c.URIs {
		if u.Scheme == fepURIScheme && u.Host == fepURIHost && len(u.Path) > 1 {
			if id != "" {
				return "", fmt.Errorf("%w: several FEP URIs", ErrNoIdentity)
			}
			id = u.Path[1:]
		}
	}
	if id == "" {
		return "", fmt.Errorf("%w: no mosto://fep/ URI", ErrNoIdentity)
	}
	if c.Subject.CommonName != id {
		return "", fmt.Errorf("%w: common name %q differs from URI id %q", ErrNoIdentity, c.Subject.CommonName, id)
	}
	if err := ValidFEPID(id); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoIdentity, err)
	}
	return id, nil
}

// FEPFromRequest returns the FEP id of the verified client certificate of
// an HTTP request served with ServerTLSConfig. It fails with ErrNoIdentity
// when the request came without TLS or without a verified client cert.
func FEPFromRequest(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", ErrNoIdentity
	}
	return FEPFromCert(r.TLS.VerifiedChains[0][0])
}

// AuthorizeFEP checks that the request is authenticated as fepID: a
// certificate for FEP a cannot act (register, report, watch) as FEP b.
func AuthorizeFEP(r *http.Request, fepID string) error {
	got, err := FEPFromRequest(r)
	if err != nil {
		return err
	}
	if got != fepID {
		return fmt.Errorf("%w: certificate is for %q, request acts as %q", ErrWrongFEP, got, fepID)
	}
	return nil
}

// parseCSR decodes and checks a PEM certificate request.
func parseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	blk, _ := pem.Decode(csrPEM)
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: no CERTIFICATE REQUEST PEM block", ErrCSR)
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %w", ErrCSR, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("%w: ECDSA curve %s not accepted (use P-256 or P-384)", ErrCSR, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return nil, fmt.Errorf("%w: key type %T not accepted (use ECDSA P-256 or Ed25519)", ErrCSR, csr.PublicKey)
	}
	return csr, nil
}

// Files of the operator's client certificate under DATA/pki.
const (
	AdminCertFile = "admin.crt"
	AdminKeyFile  = "admin.key"
)

// IssueAdmin writes a client certificate for the operator (common name
// api.AdminIdentity, allowed by the API to act for any FEP) into DATA/pki,
// for curl or scripts: curl --cacert ca.crt --cert admin.crt --key admin.key.
func (ca *CA) IssueAdmin(dataDir string, now time.Time) error {
	key, keyPEM, err := GenerateKey()
	if err != nil {
		return err
	}
	csr, err := NewCSR(key, api.AdminIdentity)
	if err != nil {
		return err
	}
	if now.IsZero() {
		now = time.Now()
	}
	cert, err := ca.signClient(csr, api.AdminIdentity, now)
	if err != nil {
		return err
	}
	dir := Dir(dataDir)
	if err := atomicfile.Write(filepath.Join(dir, AdminKeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, AdminCertFile), cert, 0o600); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}
