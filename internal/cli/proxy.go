package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/agent"
	"github.com/mosto-net/mosto/internal/relay"
)

// runProxy runs the split-TCP proxy daemon of one FEP until ctx is
// cancelled (SIGINT/SIGTERM), then drains. With a controller section it
// also runs the agent, which feeds the daemon chains, members and keys.
// The agent hands its table's member policy to the relay.
var _ relay.MemberPolicySource = (*agent.Agent)(nil)

func runProxy(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "proxy")
	config := fs.String("config", "", "proxy configuration file (YAML, see docs/proxy.md)")
	check := fs.Bool("check", false, "validate the configuration (keys, chain table) without binding anything, and exit")
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
	pf, err := LoadProxyFile(*config)
	if err != nil {
		return err
	}
	cfg := &pf.Config
	acfg, err := pf.agentConfig()
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
	if err := takeActivated(env, cfg, acfg); err != nil {
		return err
	}
	if cfg.Workers > 1 {
		w := os.Getenv(relay.WorkerEnv)
		if w == "" {
			return superviseWorkers(ctx, env, cfg, args)
		}
		i, err := strconv.Atoi(w)
		if err != nil {
			return fmt.Errorf("%s=%q: not a worker number", relay.WorkerEnv, w)
		}
		if cfg, err = cfg.ForWorker(i); err != nil {
			return err
		}
		env.Log = env.Log.With("worker", i)
	}
	srv, err := relay.New(cfg, env.Log)
	if err != nil {
		return err
	}
	if acfg == nil {
		return srv.Run(ctx)
	}
	var ag *agent.Agent
	acfg.Stats = agent.StatsFrom(srv.Registry(), time.Now(), func() uint64 { return ag.Version() })
	wireOnPath(acfg, srv, env.Log)
	ag, err = agent.New(*acfg, env.Log)
	if err != nil {
		srv.Close()
		return err
	}
	srv.SetChains(ag)
	srv.SetMemberSource(ag) // and the controller's member policy (relay.MemberPolicySource)
	srv.SetKeySource(ag)
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go runAgent(actx, &wg, env, ag, acfg.ProbeConn != nil)
	err = srv.Run(ctx)
	stop()
	wg.Wait()
	return err
}

// superviseWorkers runs cfg.Workers copies of this `mosto proxy` command
// (the same executable and arguments, with relay.WorkerEnv set to the
// worker's number) that share the listeners with SO_REUSEPORT, restarts
// any that dies, and on SIGTERM stops them all and waits for their drains.
func superviseWorkers(ctx context.Context, env *Env, cfg *relay.Config, args []string) error {
	if err := relay.Check(cfg); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("workers: find this executable: %w", err)
	}
	drain := time.Duration(cfg.Timeouts.Drain)
	if drain == 0 {
		drain = relay.DefaultDrainTimeout
	}
	sv := &relay.Supervisor{
		N:    cfg.Workers,
		Stop: drain + 5*time.Second,
		Log:  env.Log,
		Command: func(i int) *exec.Cmd {
			cmd := exec.Command(exe, append([]string{"proxy"}, args...)...)
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", relay.WorkerEnv, i))
			cmd.Stdout, cmd.Stderr = env.Stdout, env.Stderr
			return cmd
		},
	}
	env.Log.Info("supervising workers", "fep", cfg.ID, "workers", cfg.Workers)
	return sv.Run(ctx)
}

// runAgent runs the controller agent until ctx ends. The daemon keeps
// serving with the last table if the agent fails. passedProbe: the agent
// measures on a socket systemd passed (logged here, beside the relay
// starting, rather than before it).
func runAgent(ctx context.Context, wg *sync.WaitGroup, env *Env, ag *agent.Agent, passedProbe bool) {
	defer wg.Done()
	if passedProbe {
		env.Log.Info("socket activation: the agent measures on the passed datagram socket", "probe", true)
	}
	if err := ag.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
		env.Log.Error("controller agent stopped; serving with the last table", "err", err)
	}
}
