package cli

import (
	"context"
	"fmt"

	"github.com/mosto-net/mosto/internal/relay"
)

// runProxy runs the split-TCP proxy daemon of one FEP until ctx is
// cancelled (SIGINT/SIGTERM), then drains.
func runProxy(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "proxy")
	config := fs.String("config", "", "proxy configuration file (YAML, see docs/proxy.md)")
	check := fs.Bool("check", false, "validate the configuration (keys, chain table, listen addresses) and exit")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto proxy --config FILE [--check]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *config == "" {
		return usageErrorf("--config is required")
	}
	cfg, err := relay.LoadConfig(*config)
	if err != nil {
		return err
	}
	if *check {
		if err := relay.Check(cfg); err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "%s: ok\n", *config)
		return nil
	}
	srv, err := relay.New(cfg, env.Log)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}
