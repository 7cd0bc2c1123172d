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

// TestControllerEtcdTLS: `mosto controller --etcd https://... --etcd-ca
// --etcd-cert --etcd-key` stores its state in a mutual-TLS etcd, wins the
// election, and resigns (its election key goes) when stopped.
func TestControllerEtcdTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	eps, files := etcdtest.StartTLS(t)
	tlsCfg, err := etcdhttp.TLSConfig(files.CA, files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := etcdhttp.New(etcdhttp.Config{Endpoints: eps, TLS: tlsCfg})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env, _, _ := testEnv()
	done := make(chan error, 1)
	go func() {
		done <- runController(ctx, env, []string{"--data", t.TempDir(), "--insecure", "--listen", "127.0.0.1:0",
			"--etcd", strings.Join(eps, ","), "--etcd-ca", files.CA, "--etcd-cert", files.Cert, "--etcd-key", files.Key,
			"--id", "c-tls"})
	}()
	electionKeys := func() []string {
		t.Helper()
		r, err := etcd.GetPrefix(context.Background(), "/mosto/election/", false)
		if err != nil {
			t.Fatal(err)
		}
		var vals []string
		for _, kv := range r.Kvs {
			vals = append(vals, string(kv.Value))
		}
		return vals
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if v := electionKeys(); len(v) == 1 && v[0] == "c-tls" {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("controller ended early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller did not campaign in etcd within 20s (election keys %q)", electionKeys())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("controller: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("controller still running 20s after cancel")
	}
	if v := electionKeys(); len(v) != 0 {
		t.Errorf("election keys %q left after the controller stopped; want none", v)
	}
}
