package agent

import (
	"crypto/tls"
	"net/netip"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	ctlpkg "github.com/mosto-net/mosto/internal/controller"
	"github.com/mosto-net/mosto/internal/pki"
)

// trustServerConfig wires the API as `mosto controller` does.
func trustServerConfig(b api.Backend, ca *pki.CA, tokens pki.DirTokenStore, st pki.TokenUser) api.ServerConfig {
	return api.ServerConfig{Backend: b, Joiner: &pki.Joiner{CA: ca, Tokens: tokens, Store: st}, RequireClientCert: true}
}

// trustTLSConfig is the controller's TLS configuration as `mosto controller` builds it.
func trustTLSConfig(t *testing.T, ctl *ctlpkg.Controller, ca *pki.CA) *tls.Config {
	t.Helper()
	c, err := ca.ServerTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	pki.RefuseRevoked(c, ctl.Revoked)
	return c
}

func trustRotationConfig() ctlpkg.Config {
	return ctlpkg.Config{KeyRotation: 300 * time.Millisecond}
}

func trustLightConfig(c ctlpkg.Config) ctlpkg.Config {
	c.LightBound = true
	return c
}

func trustMemberConfig(allow []string) ctlpkg.Config {
	p := ctlpkg.MemberPolicy{Enforce: true}
	for _, a := range allow {
		p.Allow = append(p.Allow, netip.MustParsePrefix(a))
	}
	return ctlpkg.Config{Members: p}
}
