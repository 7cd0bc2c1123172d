package cli

import (
	"context"
	"fmt"
)

// runBench dispatches `mosto bench proxy` and `mosto bench transfer`.
func runBench(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(env.Stderr, `usage: mosto bench <benchmark> [flags]

benchmarks:
  proxy     throughput and latency of the proxy data path
  transfer  direct vs mosto vs an nginx CDN front-end in an emulated world
  tts       transparent segmentation: seed 002's tables and a loss x RTT grid
  offload   leaving the data path after slow start: Fig. 3 traces, veth throughput and CPU
  get       mosto get vs aria2c and curl: seed 003's multi-source, failure and multipath scenarios
  router    request router: handoff vs 302 vs proxy vs DNS vs nginx L7 (seed 004)

Run 'mosto bench <benchmark> -h' for its flags.
`)
		if len(args) == 0 {
			return usageErrorf("missing benchmark name")
		}
		return nil
	}
	switch args[0] {
	case "proxy":
		return runBenchProxy(ctx, env, args[1:])
	case "transfer":
		return runBenchTransfer(ctx, env, args[1:])
	case "tts":
		return runBenchTTS(ctx, env, args[1:])
	case "offload":
		return runBenchOffload(ctx, env, args[1:])
	case "get":
		return runBenchGet(ctx, env, args[1:])
	case "router":
		return runBenchRouter(ctx, env, args[1:])
	}
	return usageErrorf("unknown benchmark %q (want proxy, transfer, tts, offload, get or router)", args[0])
}
