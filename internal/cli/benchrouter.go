package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/mosto-net/mosto/internal/routerbench"
	"github.com/mosto-net/mosto/internal/transfer"
)

// runBenchRouter runs `mosto bench router` (needs root: an emulated world).
func runBenchRouter(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "bench router")
	hops := fs.String("hops", "1,2,4,8", "forwarding hosts between the client and rr/surrogates (1-8), comma-separated")
	runs := fs.Int("runs", 30, "fetches per mode and hop count (and sessions per mode)")
	size := fs.String("size", "10KB", "object of the latency fetches")
	bulk := fs.String("bulk-size", "100MB", "object of the bulk fetches (1GB for the seed's figure)")
	bulkRuns := fs.Int("bulk-runs", 3, "bulk fetches per mode (0: none)")
	requests := fs.Int("requests", 20, "requests per session in the L7 scenarios")
	hopMS := fs.Float64("hop-ms", 0.5, "one-way delay of every segment (ms)")
	modes := fs.String("modes", strings.Join(routerbench.Modes, ","), "modes to measure")
	loss := fs.Float64("loss", 0, "loss (%) on the client's first segment, both ways")
	strip := fs.Bool("strip-options", false, "turn SACK, timestamps and window scaling off in every host (the seed's setting)")
	cc := fs.String("cc", "", "TCP congestion control of every host (default: the machine's, bbr here), e.g. cubic")
	rrOnPath := fs.Bool("rr-on-path", false, "route the clients to the surrogates through rr (a plain forwarder for them): direct fetches then cross rr as handed-off responses do")
	geo := fs.Bool("geo", false, "the geographic world (WonderProxy RTTs; --hops are then client numbers 1-6: Dublin, Paris, Warsaw, NewYork, Toronto, Chicago) instead of the linear one")
	bulkOnly := fs.Bool("bulk-only", false, "only the bulk downloads")
	routerSite := fs.Bool("router-site", false, "--geo: the proxy and handoff routers rank surrogates from rr's site (mosto router --site), since the response crosses rr")
	handshakes := fs.Int("handshakes", 0, "first measure this many connects to the handoff router, a plain server on rr and s1, interleaved (with --bulk-only --bulk-runs 0: only these)")
	ref := fs.String("ref", "handoff", "the mode the latency tables compare the others with (A12, p), e.g. handoff-s")
	dir := fs.String("dir", "", "work directory (default: a new temporary directory)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := routerbench.Config{Ref: *ref, Runs: *runs, BulkRuns: *bulkRuns, Requests: *requests, HopMS: *hopMS, Log: env.Log, Dir: *dir,
		LossPct: *loss, StripOptions: *strip, BulkOnly: *bulkOnly, RROnPath: *rrOnPath, Geo: *geo, Handshakes: *handshakes, RouterSite: *routerSite, Congestion: *cc}
	hopsSet := false
	fs.Visit(func(f *flag.Flag) { hopsSet = hopsSet || f.Name == "hops" })
	for _, h := range strings.Split(*hops, ",") {
		if *geo && !hopsSet {
			break // every client of the geographic world
		}
		n, err := strconv.Atoi(strings.TrimSpace(h))
		if err != nil {
			return usageErrorf("--hops %q: %v", *hops, err)
		}
		cfg.Hops = append(cfg.Hops, n)
	}
	var err error
	if cfg.Size, err = transfer.ParseSize(*size); err != nil {
		return usageErrorf("--size: %v", err)
	}
	if cfg.BulkSize, err = transfer.ParseSize(*bulk); err != nil {
		return usageErrorf("--bulk-size: %v", err)
	}
	cfg.Modes = strings.Split(*modes, ",")
	if cfg.Mosto, err = os.Executable(); err != nil {
		return err
	}
	if cfg.Dir == "" {
		if cfg.Dir, err = os.MkdirTemp("", "mosto-bench-router-"); err != nil {
			return err
		}
		defer os.RemoveAll(cfg.Dir)
	}
	fmt.Fprintf(env.Stderr, "bench router: work directory %s\n", cfg.Dir)
	return routerbench.Run(ctx, cfg, env.Stdout)
}
