package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/mosto-net/mosto/internal/pki"
)

// runToken implements `mosto token create`: it prints a new join token for
// proxies and stores its hash in the controller's data directory.
func runToken(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || args[0] != "create" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(env.Stdout, "usage: mosto token create --data DIR [--ttl 24h] [--fep ID] [--reusable]")
			return nil
		}
		return usageErrorf("want: mosto token create --data DIR [--ttl 24h] [--fep ID] [--reusable]")
	}
	fs := newFlagSet(env, "token create")
	data := fs.String("data", "", "controller data directory (made by `mosto controller init`; required)")
	ttl := fs.Duration("ttl", pki.DefaultTokenTTL, "lifetime of the token")
	fep := fs.String("fep", "", "bind the token to this FEP id (default: any id may join with it)")
	reusable := fs.Bool("reusable", false, "allow any number of joins until expiry (default: single use)")
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
	ca, err := pki.LoadCA(*data)
	if err != nil {
		return err
	}
	tok, rec, err := ca.CreateToken(ctx, pki.DirTokenStore{Dir: pki.TokenDir(*data)}, pki.TokenOptions{TTL: *ttl, FEP: *fep, Reusable: *reusable})
	if err != nil {
		return err
	}
	use := "single use"
	if rec.Reusable {
		use = "reusable"
	}
	bound := "any FEP"
	if rec.FEP != "" {
		bound = "FEP " + rec.FEP
	}
	fmt.Fprintln(env.Stdout, tok.String())
	fmt.Fprintf(env.Stderr, "token %s: %s, for %s, expires %s\n", rec.ID, use, bound, rec.Expires.Format(time.RFC3339))
	return nil
}
