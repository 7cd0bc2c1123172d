package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/atomicfile"
)

// File names under DATA/pki.
const (
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
	serverCertFile = "server.crt"
	serverKeyFile  = "server.key"
)

// Validity periods.
const (
	CAValidity     = 10 * 365 * 24 * time.Hour
	ServerValidity = 2 * 365 * 24 * time.Hour
	FEPValidity    = 365 * 24 * time.Hour
	clockSkew      = 5 * time.Minute // NotBefore is backdated by this much
)

// ErrExist is returned by Init when the data directory already holds a CA.
var ErrExist = errors.New("pki: CA already exists")

// CA is the controller's certificate authority together with the
// controller's server certificate, as loaded from DATA/pki.
type CA struct {
	Cert   *x509.Certificate
	key    crypto.Signer
	pem    []byte          // the CA certificate, PEM
	server tls.Certificate // leaf + CA; empty when no server cert exists
}

// Dir returns the directory holding the PKI files of a controller data directory.
func Dir(dataDir string) string { return filepath.Join(dataDir, "pki") }

// InitOptions says what Init creates.
type InitOptions struct {
	// Hosts are the DNS names and IP addresses the controller's server
	// certificate is valid for. Empty means localhost, 127.0.0.1 and ::1.
	Hosts []string
	// CADir, when set, is the pki directory of an existing controller whose
	// CA is reused (several controllers of one HA group share one CA);
	// only the server certificate is new.
	CADir string
	Now   time.Time // zero means time.Now()
}

// Init creates DATA/pki with a new CA (ECDSA P-256, 10 years) and a server
// certificate for the controller. It refuses to overwrite an existing CA.
func Init(dataDir string, opt InitOptions) (*CA, error) {
	now := opt.Now
	if now.IsZero() {
		now = time.Now()
	}
	dir := Dir(dataDir)
	if _, err := os.Stat(filepath.Join(dir, caCertFile)); err == nil {
		return nil, fmt.Errorf("%w in %s", ErrExist, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	var ca *CA
	if opt.CADir != "" {
		c, err := loadCAFiles(opt.CADir)
		if err != nil {
			return nil, fmt.Errorf("pki: reuse CA: %w", err)
		}
		ca = c
	} else {
		c, err := newCA(now)
		if err != nil {
			return nil, err
		}
		ca = c
	}
	keyPEM, err := marshalKey(ca.key)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(dir, caKeyFile), keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, caCertFile), ca.pem, 0o644); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := ca.issueServerCert(dir, opt.Hosts, now); err != nil {
		return nil, err
	}
	return ca, nil
}

func newCA(now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "mosto CA", Organization: []string{"mosto"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// issueServerCert writes server.crt/server.key into dir and loads them into ca.
func (ca *CA) issueServerCert(dir string, hosts []string, now time.Time) error {
	if len(hosts) == 0 {
		hosts = []string{"localhost", "127.0.0.1", "::1"}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: generate server key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "mosto controller", Organization: []string{"mosto"}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     minTime(now.Add(ServerValidity), ca.Cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		switch {
		case h == "":
		case net.ParseIP(h) != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(h))
		default:
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return fmt.Errorf("pki: create server certificate: %w", err)
	}
	keyPEM, err := marshalKey(key)
	if err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := atomicfile.Write(filepath.Join(dir, serverKeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, serverCertFile), certPEM, 0o644); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return ca.loadServer(certPEM, keyPEM)
}

func (ca *CA) loadServer(certPEM, keyPEM []byte) error {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("pki: server key pair: %w", err)
	}
	// Send the CA along so a joining proxy can find the certificate its
	// token's hash pins.
	pair.Certificate = append(pair.Certificate, ca.Cert.Raw)
	ca.server = pair
	return nil
}

// LoadCA loads the CA and the server certificate from DATA/pki, as written
// by Init (`mosto controller init`).
func LoadCA(dataDir string) (*CA, error) {
	dir := Dir(dataDir)
	ca, err := loadCAFiles(dir)
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, serverCertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, serverKeyFile))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := ca.loadServer(certPEM, keyPEM); err != nil {
		return nil, err
	}
	return ca, nil
}

func loadCAFiles(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: %w (run `mosto controller init` first)", err)
	}
	cert, err := ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", caCertFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", caCertFile)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", caKeyFile, err)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s does not match %s", caKeyFile, caCertFile)
	}
	return &CA{Cert: cert, key: key, pem: certPEM}, nil
}

// PEM returns the CA certificate in PEM form.
func (ca *CA) PEM() []byte { return append([]byte(nil), ca.pem...) }

// Hash returns the pin of the CA: "sha256:" and the hex SHA-256 of its
// SubjectPublicKeyInfo.
func (ca *CA) Hash() string { return CertHash(ca.Cert) }

// CertHash returns "sha256:<hex>" of a certificate's SubjectPublicKeyInfo,
// the form carried in join tokens.
func CertHash(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Pool returns a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ParseCertPEM parses the first CERTIFICATE block of b.
func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no CERTIFICATE PEM block")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

func marshalKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseKeyPEM(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	var k any
	var err error
	switch blk.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	default:
		return nil, fmt.Errorf("unexpected PEM block %q", blk.Type)
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key type %T cannot sign", k)
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
