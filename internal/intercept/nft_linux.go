package intercept

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// Interception is an installed set of rules. Remove takes them away.
type Interception struct {
	mu   sync.Mutex // guards cfg (SetScopes)
	cfg  Config
	log  *slog.Logger
	once sync.Once
	err  error
}

// Install validates cfg, removes whatever an earlier run with the same name
// left (its table, policy rules and routes), and installs the rules: first
// the policy route that delivers marked packets locally (and the legs'
// routes with Config.InitCwnd), then the nftables table in one
// transaction. The table goes last because it starts the interception: a
// flow intercepted before the legs' routes exist would start at the
// kernel's initial window.
func Install(ctx context.Context, cfg Config, log *slog.Logger) (*Interception, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := removeRoute(ctx, &cfg); err != nil {
		return nil, err
	}
	mark, table := strconv.FormatUint(uint64(cfg.Mark), 10), strconv.Itoa(cfg.RouteTable)
	if err := runIP(ctx, cfg.NetNS, "rule", "add", "fwmark", mark, "lookup", table); err != nil {
		removeRoute(ctx, &cfg)
		return nil, fmt.Errorf("intercept: policy rule: %w", err)
	}
	if err := runIP(ctx, cfg.NetNS, "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", table); err != nil {
		removeRoute(ctx, &cfg)
		return nil, fmt.Errorf("intercept: local route: %w", err)
	}
	if cfg.InitCwnd > 0 {
		if err := installLegRoutes(ctx, &cfg); err != nil {
			removeRoute(ctx, &cfg)
			return nil, err
		}
	}
	if err := runNft(ctx, cfg.NetNS, cfg.Ruleset(os.Getpid())); err != nil {
		removeRoute(ctx, &cfg)
		deleteTable(ctx, &cfg)
		return nil, fmt.Errorf("intercept: install table %s: %w", cfg.Table(), err)
	}
	log.Info("interception installed", "table", cfg.Table(), "port", cfg.Port, "fail_closed", cfg.FailClosed, "netns", cfg.NetNS)
	return &Interception{cfg: cfg, log: log}, nil
}

// SetScopes replaces the scopes of the installed rules (one nftables
// transaction: the table is replaced atomically, the rule that delivers
// the packets of intercepted flows to their sockets stays, so established
// flows go on) and makes the interception managed (Config.Managed).
func (i *Interception) SetScopes(ctx context.Context, scopes []Scope) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	cfg := i.cfg
	cfg.Managed, cfg.Scopes = true, scopes
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := runNft(ctx, cfg.NetNS, cfg.Ruleset(os.Getpid())); err != nil {
		return fmt.Errorf("intercept: update table %s: %w", cfg.Table(), err)
	}
	i.cfg = cfg
	i.log.Info("interception scopes updated", "table", cfg.Table(), "scopes", len(scopes))
	return nil
}

// Config returns the installed (validated) config.
func (i *Interception) Config() Config {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.cfg
}

// Remove deletes the table, the policy rule and the route. It is
// idempotent and uses its own context so that it also runs after the
// caller's was cancelled.
func (i *Interception) Remove() error {
	i.once.Do(func() {
		i.mu.Lock()
		defer i.mu.Unlock()
		ctx := context.Background()
		i.err = errors.Join(deleteTable(ctx, &i.cfg), removeRoute(ctx, &i.cfg))
		i.log.Info("interception removed", "table", i.cfg.Table(), "err", i.err)
	})
	return i.err
}

// Cleanup removes what an interception named cfg.Name left (after a
// crash): its table, its policy rules and its route table. Missing pieces
// are not errors.
func Cleanup(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return errors.Join(deleteTable(ctx, &cfg), removeRoute(ctx, &cfg))
}

// Tables lists this package's nftables tables in netns ("" = the calling
// process's).
func Tables(ctx context.Context, netns string) ([]string, error) {
	out, err := command(ctx, netns, "nft", "list", "tables", "ip").Output()
	if err != nil {
		return nil, fmt.Errorf("intercept: nft list tables: %w", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" && strings.HasPrefix(f[2], TablePrefix) {
			names = append(names, f[2])
		}
	}
	return names, nil
}

func deleteTable(ctx context.Context, cfg *Config) error {
	t := cfg.Table()
	// "add" then "delete" in one transaction: no error when it is missing.
	if err := runNft(ctx, cfg.NetNS, fmt.Sprintf("add table ip %s\ndelete table ip %s\n", t, t)); err != nil {
		return fmt.Errorf("intercept: delete table %s: %w", t, err)
	}
	return nil
}

// removeRoute deletes every policy rule for the mark and flushes the
// route table; the same for the legs' mark and table when InitCwnd is set
// or a rule of theirs was there (a crashed run used them).
func removeRoute(ctx context.Context, cfg *Config) error {
	var errs []error
	for i, mt := range [][2]string{
		{strconv.FormatUint(uint64(cfg.Mark), 10), strconv.Itoa(cfg.RouteTable)},
		{strconv.FormatUint(uint64(cfg.legMark()), 10), strconv.Itoa(cfg.legTable())},
	} {
		mark, table := mt[0], mt[1]
		deleted := 0
		for range 64 {
			if runIP(ctx, cfg.NetNS, "rule", "del", "fwmark", mark, "lookup", table) != nil {
				break
			}
			deleted++
		}
		if i == 1 && deleted == 0 && cfg.InitCwnd == 0 {
			continue // the legs' table was never ours
		}
		out, err := command(ctx, cfg.NetNS, "ip", "route", "flush", "table", table).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "does not exist") {
			errs = append(errs, fmt.Errorf("intercept: flush route table %s: %v: %s", table, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// installLegRoutes copies the main table's IPv4 routes into the legs'
// table with `initcwnd`, and sends the packets of sockets with the legs'
// mark to it (Config.InitCwnd). A destination the copy lacks (a route
// added later) falls through to the main table, at the kernel's initial
// window.
func installLegRoutes(ctx context.Context, cfg *Config) error {
	out, err := command(ctx, cfg.NetNS, "ip", "-4", "route", "show", "table", "main").Output()
	if err != nil {
		return fmt.Errorf("intercept: list routes: %w", err)
	}
	table := strconv.Itoa(cfg.legTable())
	batch := legRoutes(string(out), table, cfg.InitCwnd)
	if batch == "" {
		return errors.New("intercept: initcwnd: the main table has no IPv4 route")
	}
	cmd := command(ctx, cfg.NetNS, "ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(batch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("intercept: initcwnd routes: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := runIP(ctx, cfg.NetNS, "rule", "add", "fwmark", strconv.FormatUint(uint64(cfg.legMark()), 10), "lookup", table); err != nil {
		return fmt.Errorf("intercept: initcwnd rule: %w", err)
	}
	return nil
}

func command(ctx context.Context, netns, name string, args ...string) *exec.Cmd {
	if netns != "" {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns, name}, args...)...)
	}
	return exec.CommandContext(ctx, name, args...)
}

func runNft(ctx context.Context, netns, script string) error {
	cmd := command(ctx, netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func runIP(ctx context.Context, netns string, args ...string) error {
	if netns != "" {
		args = append([]string{"-n", netns}, args...)
	}
	if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
