package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
)

func testEnv() (*Env, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Log: slog.New(slog.DiscardHandler)}, &out, &errb
}

func TestControllerInitAndTokenCreate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	env, out, _ := testEnv()
	if err := runControllerInit(ctx, env, []string{"--data", dir, "--hosts", "ctl.test,127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pki.Dir(dir), pki.AdminCertFile)); err != nil {
		t.Errorf("no admin certificate: %v", err)
	}
	if !strings.Contains(out.String(), ca.Hash()) {
		t.Errorf("init output does not show the CA pin:\n%s", out)
	}
	if err := runControllerInit(ctx, env, []string{"--data", dir}); !errors.Is(err, pki.ErrExist) {
		t.Errorf("second init = %v; want ErrExist", err)
	}

	env, out, _ = testEnv()
	if err := runToken(ctx, env, []string{"create", "--data", dir, "--ttl", "1h", "--fep", "fra"}); err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(out.String())
	if _, err := pki.ParseToken(tok); err != nil {
		t.Fatalf("printed token %q: %v", tok, err)
	}
	store := pki.DirTokenStore{Dir: pki.TokenDir(dir)}
	if _, err := ca.VerifyToken(ctx, store, tok, "par", time.Now()); !errors.Is(err, pki.ErrToken) {
		t.Errorf("token bound to fra accepted for par: %v", err)
	}
	if _, err := ca.VerifyToken(ctx, store, tok, "fra", time.Now().Add(2*time.Hour)); !errors.Is(err, pki.ErrToken) {
		t.Errorf("1h token accepted after 2h: %v", err)
	}
	if _, err := ca.VerifyToken(ctx, store, tok, "fra", time.Now()); err != nil {
		t.Errorf("fresh token refused: %v", err)
	}

	// An HA peer reuses the CA and the overlay keys.
	dir2 := t.TempDir()
	env, _, _ = testEnv()
	if err := runControllerInit(ctx, env, []string{"--data", dir2, "--ca-from", dir}); err != nil {
		t.Fatal(err)
	}
	ca2, err := pki.LoadCA(dir2)
	if err != nil || ca2.Hash() != ca.Hash() {
		t.Errorf("--ca-from: hash %v, %v; want %s", ca2, err, ca.Hash())
	}

	for _, args := range [][]string{
		{"create"},
		{"create", "--data", dir, "--ttl", "-1h"},
		{"create", "--data", dir, "--fep", "a b"},
		{"list"},
	} {
		env, _, _ = testEnv()
		if err := runToken(ctx, env, args); !errors.Is(err, errUsage) {
			t.Errorf("token %q = %v; want a usage error", args, err)
		}
	}
	env.Stdout = io.Discard
	if err := runControllerInit(ctx, env, nil); !errors.Is(err, errUsage) {
		t.Errorf("controller init without --data = %v; want a usage error", err)
	}
}

func TestTokenCreateEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	ctx := context.Background()
	dir := t.TempDir()
	env, _, _ := testEnv()
	if err := runControllerInit(ctx, env, []string{"--data", dir}); err != nil {
		t.Fatal(err)
	}
	eps := etcdtest.Start(t)
	env, out, _ := testEnv()
	if err := runToken(ctx, env, []string{"create", "--data", dir, "--etcd", strings.Join(eps, ",")}); err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(out.String())
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := ca.UseStoreToken(ctx, st, tok, "fra", time.Now()); err != nil {
		t.Fatalf("token from etcd refused: %v", err)
	}
	if err := ca.UseStoreToken(ctx, st, tok, "fra", time.Now()); !errors.Is(err, pki.ErrToken) {
		t.Errorf("token used twice: %v", err)
	}
	if _, err := os.Stat(pki.TokenDir(dir)); err == nil {
		t.Error("an etcd token was also written to DIR/tokens")
	}
}
