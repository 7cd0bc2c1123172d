package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
)

const emuUsage = `usage:
  mosto emu up [-run ID] [-state-dir DIR] WORLD.yaml   bring a world up; runs until SIGINT/SIGTERM or 'emu down'
  mosto emu exec [-run ID] HOST -- CMD [ARG...]       run a command inside a host's namespace
  mosto emu list                                      list running worlds
  mosto emu down [RUNID]                              stop a world (the only one if RUNID is omitted)
  mosto emu gc                                        remove namespaces and state left by killed worlds
  mosto emu check [-quick] [-only SECTIONS]           measure the emulator's fidelity figures
See docs/emu.md for the world spec.`

// runEmu dispatches the emu subcommands.
func runEmu(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(env.Stderr, emuUsage)
		return usageErrorf("missing subcommand")
	}
	switch args[0] {
	case "up":
		return emuUp(ctx, env, args[1:])
	case "exec":
		return emuExec(ctx, env, args[1:])
	case "list", "ls":
		return emuList(env, args[1:])
	case "down":
		return emuDown(ctx, env, args[1:])
	case "gc":
		return emuGC(env, args[1:])
	case "check":
		return emuCheck(ctx, env, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(env.Stdout, emuUsage)
		return nil
	}
	fmt.Fprintln(env.Stderr, emuUsage)
	return usageErrorf("unknown subcommand %q", args[0])
}

func emuUp(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "emu up")
	runID := fs.String("run", "", "run id (1-6 lowercase letters or digits); default random")
	stateDir := fs.String("state-dir", emu.DefaultStateDir, "directory for the world's state file")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("emu up needs exactly one WORLD.yaml")
	}
	data, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	spec, err := emu.ParseSpec(data)
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	w, err := emu.UpWith(ctx, spec, env.Log, emu.UpOptions{RunID: *runID, StateDir: *stateDir})
	if err != nil {
		return err
	}
	defer w.Close()
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tADDRESS\tNETNS")
	for _, h := range w.Hosts() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", h, w.Addr(h), w.NetNS(h))
	}
	tw.Flush()
	fmt.Fprintf(env.Stdout, "world %q up, run id %s. Try: mosto emu exec %s -- ping %s\nStop with Ctrl-C or: mosto emu down %s\n",
		spec.Name, w.RunID(), w.Hosts()[0], w.Addr(w.Hosts()[len(w.Hosts())-1]), w.RunID())
	<-ctx.Done()
	fmt.Fprintln(env.Stdout, "bringing the world down")
	return w.Close()
}

// findWorld returns the live world with run id id, or the only live one.
func findWorld(stateDir, id string) (emu.State, error) {
	states, err := emu.ReadStates(stateDir)
	if err != nil {
		return emu.State{}, err
	}
	var live []emu.State
	for _, st := range states {
		if st.Alive() && (id == "" || st.RunID == id) {
			live = append(live, st)
		}
	}
	switch {
	case len(live) == 1:
		return live[0], nil
	case len(live) == 0 && id != "":
		return emu.State{}, fmt.Errorf("no running world with run id %q (see mosto emu list)", id)
	case len(live) == 0:
		return emu.State{}, errors.New("no running world (start one with mosto emu up)")
	}
	var ids []string
	for _, st := range live {
		ids = append(ids, st.RunID)
	}
	return emu.State{}, usageErrorf("%d worlds are running (%s): choose one with -run ID", len(live), strings.Join(ids, ", "))
}

func emuExec(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "emu exec")
	runID := fs.String("run", "", "run id of the world (default: the only running one)")
	stateDir := fs.String("state-dir", emu.DefaultStateDir, "state directory")
	// Split at the first "--" ourselves: everything after it is the command,
	// flags included.
	var command []string
	for i, a := range args {
		if a == "--" {
			args, command = args[:i], args[i+1:]
			break
		}
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	pos = append(pos, command...)
	if len(pos) < 2 {
		return usageErrorf("usage: mosto emu exec [-run ID] HOST -- CMD [ARG...]")
	}
	st, err := findWorld(*stateDir, *runID)
	if err != nil {
		return err
	}
	var ns string
	var names []string
	for _, h := range st.Hosts {
		names = append(names, h.Name)
		if h.Name == pos[0] {
			ns = h.NetNS
		}
	}
	if ns == "" {
		return usageErrorf("world %s has no host %q (hosts: %s)", st.RunID, pos[0], strings.Join(names, ", "))
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, pos[1:]...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = env.Stdin, env.Stdout, env.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("exec in %s: %w", pos[0], err)
	}
	return nil
}

func emuList(env *Env, args []string) error {
	fs := newFlagSet(env, "emu list")
	stateDir := fs.String("state-dir", emu.DefaultStateDir, "state directory")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	states, err := emu.ReadStates(*stateDir)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tNAME\tPID\tHOSTS\tSTATUS")
	for _, st := range states {
		status := "running"
		if !st.Alive() {
			status = "dead (mosto emu gc)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", st.RunID, st.Name, st.PID, len(st.Hosts), status)
	}
	return tw.Flush()
}

func emuDown(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "emu down")
	stateDir := fs.String("state-dir", emu.DefaultStateDir, "state directory")
	timeout := fs.Duration("timeout", 15*time.Second, "how long to wait for the world to go down")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageErrorf("usage: mosto emu down [RUNID]")
	}
	id := ""
	if len(pos) == 1 {
		id = pos[0]
	}
	st, err := findWorld(*stateDir, id)
	if err != nil {
		return err
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal world %s (pid %d): %w", st.RunID, st.PID, err)
	}
	dir := filepath.Join(*stateDir, st.RunID)
	deadline := time.Now().Add(*timeout)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(env.Stdout, "world %s is down\n", st.RunID)
			return nil
		}
		if !st.Alive() {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if st.Alive() {
		return fmt.Errorf("world %s (pid %d) did not stop within %v", st.RunID, st.PID, *timeout)
	}
	// The owner died without cleaning up.
	removed, err := emu.GC(*stateDir, env.Log)
	fmt.Fprintf(env.Stdout, "world %s is down (removed %d leftover namespaces)\n", st.RunID, len(removed))
	return err
}

func emuGC(env *Env, args []string) error {
	fs := newFlagSet(env, "emu gc")
	stateDir := fs.String("state-dir", emu.DefaultStateDir, "state directory")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	removed, err := emu.GC(*stateDir, env.Log)
	for _, ns := range removed {
		fmt.Fprintf(env.Stdout, "removed netns %s\n", ns)
	}
	fmt.Fprintf(env.Stdout, "gc: removed %d namespaces\n", len(removed))
	return err
}

func emuCheck(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "emu check")
	quick := fs.Bool("quick", false, "fewer samples and shorter runs")
	only := fs.String("only", "", "comma-separated sections: "+strings.Join(emu.CheckSections, ","))
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("emu check takes no arguments")
	}
	var secs []string
	if *only != "" {
		secs = strings.Split(*only, ",")
		for _, s := range secs {
			found := false
			for _, c := range emu.CheckSections {
				found = found || c == s
			}
			if !found {
				return usageErrorf("unknown section %q (have %s)", s, strings.Join(emu.CheckSections, ","))
			}
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("emu check needs root (network namespaces and TUN devices)")
	}
	return emu.Check(ctx, env.Stdout, emu.CheckOptions{Sections: secs, Quick: *quick, Log: env.Log})
}
