package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/pki"
)

// runControllerInit implements `mosto controller init`: it creates the CA,
// the controller's server certificate and the first overlay keys in the
// data directory.
func runControllerInit(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "controller init")
	data := fs.String("data", "", "controller data directory (required)")
	hosts := fs.String("hosts", "localhost,127.0.0.1,::1", "comma-separated DNS names and IPs of the controller's server certificate")
	caFrom := fs.String("ca-from", "", "reuse the CA of another controller's data directory (HA group) instead of making one")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto controller init --data DIR [--hosts NAMES] [--ca-from DIR]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *data == "" {
		return usageErrorf("--data is required")
	}
	opt := pki.InitOptions{Hosts: splitList(*hosts)}
	if *caFrom != "" {
		opt.CADir = pki.Dir(*caFrom)
	}
	ca, err := pki.Init(*data, opt)
	if err != nil {
		return err
	}
	keysPath := filepath.Join(pki.Dir(*data), pki.OverlayKeysFile)
	if *caFrom != "" {
		// An HA group shares its overlay keys too.
		ks, err := pki.LoadOverlayKeys(filepath.Join(pki.Dir(*caFrom), pki.OverlayKeysFile))
		if err != nil {
			return err
		}
		if err := pki.SaveOverlayKeys(keysPath, ks); err != nil {
			return err
		}
	} else {
		ks, err := pki.NewOverlayKeys(time.Now())
		if err != nil {
			return err
		}
		if err := pki.SaveOverlayKeys(keysPath, ks); err != nil {
			return err
		}
	}
	if err := ca.IssueAdmin(*data, time.Time{}); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "CA:           %s\n", filepath.Join(pki.Dir(*data), "ca.crt"))
	fmt.Fprintf(env.Stdout, "CA pin:       %s\n", ca.Hash())
	fmt.Fprintf(env.Stdout, "server cert:  %s (hosts %s)\n", filepath.Join(pki.Dir(*data), "server.crt"), strings.Join(opt.Hosts, ","))
	fmt.Fprintf(env.Stdout, "overlay keys: %s\n", keysPath)
	fmt.Fprintf(env.Stdout, "admin cert:   %s (key %s)\n", filepath.Join(pki.Dir(*data), pki.AdminCertFile), filepath.Join(pki.Dir(*data), pki.AdminKeyFile))
	fmt.Fprintf(env.Stdout, "next: mosto token create --data %s\n", *data)
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
