// Command mosto is the single binary of the mosto system: planner, emulator,
// proxy, controller, demo and benchmarks, each a subcommand.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mosto-net/mosto/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
