package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
)

// Env is what a subcommand may use of its process: streams and a logger.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Log    *slog.Logger
}

// errUsage marks an error caused by the command line itself; Run exits 2.
var errUsage = errors.New("usage")

// usageErrorf returns an error that makes Run print it and exit with status 2.
func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *Env, args []string) error
}

func commands() []command {
	return []command{
		{"plan", "compute proxy chains from an RTT matrix (plan, plan table, plan eval, plan bench)", runPlan},
		{"emu", "emulated multi-host network on one machine (up, exec, down, gc, check)", runEmu},
		{"proxy", "run the split-TCP proxy daemon of one FEP", runProxy},
		{"controller", "run the chain controller (controller, controller init)", runController},
		{"status", "the overlay's state in the terminal (FEPs, counters, chains of a pair, RTT changes)", runStatus},
		{"token", "issue join tokens for proxies (token create)", runToken},
		{"router", "HTTP request router: 302, proxy, handoff and DNS redirection to surrogates", runRouter},
		{"xagent", "surrogate-side translation agent for the router's handoff (--placement surrogate)", runXagent},
		{"demo", "bring up an emulated world and compare direct vs mosto transfers", runDemo},
		{"bench", "benchmarks (bench proxy, bench transfer)", runBench},
		{"get", "download one object from several mirrors over several paths (mmFTP)", runGet},
	}
}

// Run executes the mosto command line args and returns the process exit
// status: 0 on success, 1 on failure, 2 on a usage error.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	level := slog.LevelInfo
	if os.Getenv("MOSTO_DEBUG") != "" {
		level = slog.LevelDebug
	}
	env := &Env{
		Stdin:  stdin,
		Stdout: stdout,
		Stderr: stderr,
		Log:    slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, env, args[1:])
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "mosto %s: %v\n", c.name, err)
			return 2
		default:
			fmt.Fprintf(stderr, "mosto %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "mosto: unknown command %q\n", args[0])
	printUsage(stderr)
	return 2
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: mosto <command> [arguments]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'mosto <command> -h' for a command's flags.")
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(env *Env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("mosto "+name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	return fs
}

// parseFlags parses args into fs, turning flag errors into usage errors. It
// allows flags after positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageErrorf("%v", err)
		}
		rest := fs.Args()
		// flag.Parse consumes a "--" terminator: everything after it is
		// positional, even when it looks like a flag.
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
