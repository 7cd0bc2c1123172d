package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/mosto-net/mosto/internal/router"
	"github.com/mosto-net/mosto/internal/xagent"
	"github.com/mosto-net/mosto/internal/xlate"
)

// runXagent runs a surrogate's translation agent (the request router's
// surrogate-side placement) until ctx is cancelled.
func runXagent(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "xagent")
	listen := fs.String("listen", "", "control address (host:port) the routers connect to")
	keyFile := fs.String("key-file", "", "file with the key shared with the routers (at least 16 bytes)")
	prio := fs.Int("priority", 10, "SCHED_FIFO priority of the threads reading the control connections (an install races the surrogate's answer); 0: normal threads")
	var ifaces listFlag
	fs.Var(&ifaces, "interface", "device the surrogate's answers leave by (repeat; default every up, non-loopback device)")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto xagent --listen ADDR --key-file FILE [--interface DEV]...")
		fmt.Fprintln(env.Stderr, "The surrogate's network must let its answers leave with the router's source address (rp_filter, anti-spoofing: docs/router.md).")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *listen == "" || *keyFile == "" {
		return usageErrorf("--listen and --key-file are required")
	}
	key, err := readKey(*keyFile)
	if err != nil {
		return usageErrorf("%v", err)
	}
	sp, err := xlate.Open(ctx, xlate.Config{Interfaces: ifaces, Egress: true, Log: env.Log})
	if err != nil {
		return fmt.Errorf("xagent: the kernel translation: %w", err)
	}
	defer sp.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("xagent: %w", err)
	}
	if *prio < 0 || *prio > 99 {
		return usageErrorf("--priority %d: want 0-99", *prio)
	}
	a := &xagent.Agent{Key: key, Xlate: sp, Priority: *prio, Log: env.Log}
	env.Log.Info("xagent", "addr", ln.Addr().String())
	err = a.Serve(ctx, ln)
	env.Log.Info("xagent stopped", "stats", fmt.Sprintf("%+v", a.Stats()), "xlate", fmt.Sprintf("%+v", sp.Stats()))
	return err
}

// The router's joiner takes the placer as its Placer.
var _ router.Placer = (*xagent.Placer)(nil)

// readKey reads a shared key file (surrounding white space ignored).
func readKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < 16 {
		return nil, fmt.Errorf("key file %s: %d bytes, want at least 16", path, len(b))
	}
	return b, nil
}

// newPlacer builds the router's placer from --agent SURROGATE=AGENT.
func newPlacer(env *Env, agents []string, keyFile string) (*xagent.Placer, error) {
	if len(agents) == 0 || keyFile == "" {
		return nil, fmt.Errorf("--placement surrogate needs --agent and --agent-key-file")
	}
	key, err := readKey(keyFile)
	if err != nil {
		return nil, err
	}
	m := map[netip.Addr]string{}
	for _, a := range agents {
		sur, addr, ok := strings.Cut(a, "=")
		ip, err := netip.ParseAddr(sur)
		if !ok || err != nil {
			return nil, fmt.Errorf("--agent %q: want SURROGATE_HOST=AGENT_HOST:PORT", a)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("--agent %q: %v", a, err)
		}
		m[ip] = addr
	}
	return xagent.NewPlacer(xagent.PlacerConfig{Key: key, Agents: m, Log: env.Log})
}
