package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
)

// runToken implements `mosto token create`: it prints a new join token for
// proxies and stores its hash in the controller's data directory.
func runToken(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || args[0] != "create" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(env.Stdout, "usage: mosto token create --data DIR [--ttl 24h] [--fep ID] [--reusable | --etcd URLS [--etcd-ca FILE] [--etcd-cert FILE --etcd-key FILE]]")
			return nil
		}
		return usageErrorf("want: mosto token create --data DIR [--ttl 24h] [--fep ID] [--reusable]")
	}
	fs := newFlagSet(env, "token create")
	data := fs.String("data", "", "controller data directory (made by `mosto controller init`; required)")
	ttl := fs.Duration("ttl", pki.DefaultTokenTTL, "lifetime of the token")
	fep := fs.String("fep", "", "bind the token to this FEP id (default: any id may join with it)")
	reusable := fs.Bool("reusable", false, "allow any number of joins until expiry (default: single use)")
	etcd := fs.String("etcd", "", "comma-separated etcd endpoints: keep the token in the controllers' etcd store instead of DIR/tokens (single use only)")
	etcdPrefix := fs.String("etcd-prefix", "", "key prefix of the controllers' etcd store (default /mosto/)")
	etcdTLSFlags := addEtcdTLSFlags(fs)
	pos, err := parseFlags(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *data == "" {
		return usageErrorf("--data is required")
	}
	if *ttl <= 0 {
		return usageErrorf("--ttl %v must be positive", *ttl)
	}
	if *fep != "" {
		if err := pki.ValidFEPID(*fep); err != nil {
			return usageErrorf("--fep: %v", err)
		}
	}
	if *etcd != "" && *reusable {
		return usageErrorf("--reusable tokens cannot be kept in etcd")
	}
	ca, err := pki.LoadCA(*data)
	if err != nil {
		return err
	}
	opt := pki.TokenOptions{TTL: *ttl, FEP: *fep, Reusable: *reusable}
	var tok pki.Token
	var expires time.Time
	where := pki.TokenDir(*data)
	if *etcd != "" {
		tlsCfg, err := etcdTLSFlags.config()
		if err != nil {
			return err
		}
		st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: splitList(*etcd), Prefix: *etcdPrefix, TLS: tlsCfg, Log: env.Log})
		if err != nil {
			return err
		}
		defer st.Close()
		t, rec, err := ca.CreateStoreToken(ctx, st, opt)
		if err != nil {
			return err
		}
		tok, expires, where = t, rec.Expires, "etcd "+*etcd
	} else {
		t, rec, err := ca.CreateToken(ctx, pki.DirTokenStore{Dir: pki.TokenDir(*data)}, opt)
		if err != nil {
			return err
		}
		tok, expires = t, rec.Expires
	}
	use := "single use"
	if *reusable {
		use = "reusable"
	}
	bound := "any FEP"
	if *fep != "" {
		bound = "FEP " + *fep
	}
	fmt.Fprintln(env.Stdout, tok.String())
	fmt.Fprintf(env.Stderr, "token %s: %s, for %s, expires %s, kept in %s\n", tok.ID, use, bound, expires.Format(time.RFC3339), where)
	return nil
}
