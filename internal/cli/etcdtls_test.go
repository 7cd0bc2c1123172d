package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/etcdhttp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
)

// TestTokenCreateEtcdTLS: `mosto token create --etcd https://...` with the
// --etcd-ca/--etcd-cert/--etcd-key flags reaches an etcd that requires
// client certificates; without them it is refused; half a pair is a usage
// error.
func TestTokenCreateEtcdTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	ctx := context.Background()
	dir := t.TempDir()
	env, _, _ := testEnv()
	if err := runControllerInit(ctx, env, []string{"--data", dir}); err != nil {
		t.Fatal(err)
	}
	eps, files := etcdtest.StartTLS(t)
	base := []string{"create", "--data", dir, "--etcd", strings.Join(eps, ",")}

	env, out, _ := testEnv()
	if err := runToken(ctx, env, append(base, "--etcd-ca", files.CA, "--etcd-cert", files.Cert, "--etcd-key", files.Key)); err != nil {
		t.Fatalf("token create over mutual TLS: %v", err)
	}
	tok := strings.TrimSpace(out.String())
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := etcdhttp.TLSConfig(files.CA, files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: eps, TLS: tlsCfg})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := ca.UseStoreToken(ctx, st, tok, "fra", time.Now()); err != nil {
		t.Fatalf("token kept in TLS etcd refused: %v", err)
	}

	env, _, _ = testEnv()
	if err := runToken(ctx, env, append(base, "--etcd-ca", files.CA)); err == nil {
		t.Error("token create without a client certificate succeeded")
	}
	env, _, _ = testEnv()
	if err := runToken(ctx, env, append(base, "--etcd-cert", files.Cert)); err == nil || !strings.Contains(err.Error(), "key") {
		t.Errorf("--etcd-cert without --etcd-key = %v; want a usage error naming the key", err)
	}
}
