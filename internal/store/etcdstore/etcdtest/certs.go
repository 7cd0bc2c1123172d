package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// writeCerts writes a CA, a server certificate for 127.0.0.1 and a client
// certificate into dir; it returns the client's files and etcd's TLS info.
func writeCerts(dir string) (TLSFiles, transport.TLSInfo, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, transport.TLSInfo{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return TLSFiles{}, transport.TLSInfo{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return TLSFiles{}, transport.TLSInfo{}, err
	}
	leaf := func(serial int64, name string, usage ...x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
	}
	sCert, sKey, err := leaf(2, "etcd", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return TLSFiles{}, transport.TLSInfo{}, err
	}
	cCert, cKey, err := leaf(3, "mosto", x509.ExtKeyUsageClientAuth)
	if err != nil {
		return TLSFiles{}, transport.TLSInfo{}, err
	}
	files := map[string][]byte{
		"ca.pem":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"server.pem": sCert, "server-key.pem": sKey,
		"client.pem": cCert, "client-key.pem": cKey,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return TLSFiles{}, transport.TLSInfo{}, err
		}
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	return TLSFiles{CA: p("ca.pem"), Cert: p("client.pem"), Key: p("client-key.pem")},
		transport.TLSInfo{CertFile: p("server.pem"), KeyFile: p("server-key.pem"), TrustedCAFile: p("ca.pem"), ClientCertAuth: true},
		nil
}
