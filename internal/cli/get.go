package cli

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/mget"
)

// runGet is `mosto get URL [URL...]`: one object from its mirrors, over
// several paths each (internal/mget).
func runGet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "get")
	fs.Usage = func() {
		fmt.Fprint(env.Stderr, `usage: mosto get [flags] URL [URL...]

Downloads one object from all the URLs (mirrors of it) at once: receiver-driven
range requests over one sub-flow per (mirror, path). Paths: direct, and one per
--via entry (a local mosto proxy's SOCKS5 entry, which carries the flow over
the overlay's chain). With --controller, the paths are the --paths K chains
the controller ranks from --from (the local proxy's FEP) to --to (the FEP near
each mirror), each sub-flow pinned to its chain through the proxy's HTTP
CONNECT entry (--connect); sub-flows whose chains share links are coupled (they
take no more than one TCP flow would on the best of them).

flags:
`)
		fs.PrintDefaults()
	}
	out := fs.String("o", "", "output file (default: the last element of the first URL's path)")
	cont := fs.Bool("continue", false, "resume a partial download of the same version (OUT.mget)")
	sum := fs.String("sha256", "", "expected SHA-256 (hex), checked at the end")
	jsonOut := fs.Bool("json", false, "print the stats as JSON on stdout")
	var via listFlag
	fs.Var(&via, "via", "SOCKS5 entry of a local mosto proxy (host:port); repeatable: one path each")
	ctrl := fs.String("controller", "", "the controller's API URL: take the chains of each mirror from its GET /v1/paths")
	from := fs.String("from", "", "with --controller: the FEP id of the local proxy (the chains' InP)")
	to := fs.String("to", "", "with --controller: the FEP id near the mirrors (the chains' EgP), or one per URL, comma-separated")
	connect := fs.String("connect", "", "with --controller: the local proxy's HTTP CONNECT entry (host:port)")
	connectAuth := fs.String("connect-auth-file", "", "with --controller: file with USER:PASSWORD of the CONNECT entry")
	ctrlCA := fs.String("controller-ca", "", "the controller's CA certificate (PEM), for an https --controller")
	ctrlCert := fs.String("controller-cert", "", "client certificate (PEM) for the controller")
	ctrlKey := fs.String("controller-key", "", "client key (PEM) for the controller")
	paths := fs.Int("paths", 0, "paths per mirror: direct first, then the --via entries (0: direct only without --via, the entries only with it)")
	block := fs.Int64("block", 128<<10, "range size in bytes")
	stall := fs.Duration("stall", 2*time.Second, "a sub-flow that receives nothing for this long gives its ranges back and retries")
	urls, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(urls) == 0 {
		return usageErrorf("no URL")
	}
	cfg := mget.Config{Out: *out, Continue: *cont, Block: *block, Stall: *stall, Log: env.Log}
	if *block <= 0 || *stall <= 0 {
		return usageErrorf("--block and --stall must be positive")
	}
	if *sum != "" {
		b, err := hex.DecodeString(*sum)
		if err != nil || len(b) != 32 {
			return usageErrorf("--sha256 wants 64 hex digits")
		}
		cfg.SHA256 = b
	}
	if cfg.Out == "" {
		u, err := url.Parse(urls[0])
		if err != nil {
			return usageErrorf("%q: %v", urls[0], err)
		}
		cfg.Out = path.Base(u.Path)
		if cfg.Out == "/" || cfg.Out == "." || cfg.Out == "" {
			cfg.Out = "index.html"
		}
	}
	if *ctrl != "" {
		if len(via) > 0 {
			return usageErrorf("--controller and --via exclude each other")
		}
		cp := &controllerPaths{base: *ctrl, from: *from, entry: *connect, k: *paths}
		if *paths < 1 || *from == "" || *to == "" || *connect == "" {
			return usageErrorf("--controller needs --paths K (>= 1), --from, --to and --connect")
		}
		cp.to = strings.Split(*to, ",")
		if len(cp.to) != 1 && len(cp.to) != len(urls) {
			return usageErrorf("--to: %d FEPs for %d URLs; want one, or one per URL", len(cp.to), len(urls))
		}
		if *connectAuth != "" {
			if cp.user, cp.pass, err = readBasicAuth(*connectAuth); err != nil {
				return err
			}
		}
		if cp.client, err = controllerClient(*ctrlCA, *ctrlCert, *ctrlKey); err != nil {
			return err
		}
		if cfg.Sources, err = cp.sources(ctx, urls); err != nil {
			return err
		}
		return finishGet(ctx, env, cfg, *jsonOut)
	}
	type pathSpec struct {
		name  string
		entry string
	}
	all := []pathSpec{{name: "direct"}}
	for _, v := range via {
		all = append(all, pathSpec{name: "via " + v, entry: v})
	}
	use := all
	switch {
	case *paths < 0:
		return usageErrorf("--paths must be >= 0")
	case *paths == 0 && len(via) > 0:
		use = all[1:]
	case *paths == 0:
		use = all[:1]
	case *paths > len(all):
		return usageErrorf("--paths %d: only %d paths (direct + %d --via entries)", *paths, len(all), len(via))
	default:
		use = all[:*paths]
	}
	for _, u := range urls {
		for _, p := range use {
			src := mget.Source{URL: u, Path: p.name}
			if p.entry != "" {
				src.Dial = mget.ViaSOCKS5(p.entry, nil)
			}
			cfg.Sources = append(cfg.Sources, src)
		}
	}
	return finishGet(ctx, env, cfg, *jsonOut)
}

// finishGet runs the download and prints its outcome.
func finishGet(ctx context.Context, env *Env, cfg mget.Config, jsonOut bool) error {
	if f, ok := env.Stderr.(*os.File); ok && !jsonOut && isTerminal(f) {
		cfg.Progress = func(s mget.Snapshot) { drawProgress(f, s) }
	}
	st, err := mget.Get(ctx, cfg)
	if cfg.Progress != nil {
		fmt.Fprintln(env.Stderr)
	}
	if jsonOut && st != nil {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(st); jerr != nil && err == nil {
			err = jerr
		}
	}
	if err != nil {
		return err
	}
	if !jsonOut {
		fmt.Fprintf(env.Stderr, "%s: %d bytes in %.2f s (%.2f MB/s), sha256 %s\n", st.File, st.Identity.Size, st.Seconds, st.MBps, st.SHA256)
		for _, s := range st.Subflows {
			note := ""
			if s.Disabled != "" {
				note = " dropped: " + s.Disabled
			}
			fmt.Fprintf(env.Stderr, "  %-40s %-16s %10d bytes %6.2f MB/s %d stalls%s\n", s.URL, s.Path, s.Bytes+s.DupBytes, s.MBps, s.Stalls, note)
		}
	}
	return nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// drawProgress redraws one status line: a bar, the total and each
// sub-flow's rate.
func drawProgress(w io.Writer, s mget.Snapshot) {
	const width = 30
	frac := 1.0
	if s.Size > 0 {
		frac = float64(s.Received) / float64(s.Size)
	}
	fill := int(frac * width)
	var b strings.Builder
	fmt.Fprintf(&b, "\r[%s%s] %5.1f%% %s", strings.Repeat("#", fill), strings.Repeat(".", width-fill), 100*frac, s.Elapsed.Truncate(100*time.Millisecond))
	for i, r := range s.MBps {
		fmt.Fprintf(&b, " | %s %.1f MB/s", shortName(s.Names[i]), r)
	}
	b.WriteString("\x1b[K")
	io.WriteString(w, b.String())
}

func shortName(s string) string {
	if len(s) > 24 {
		return s[:24]
	}
	return s
}
