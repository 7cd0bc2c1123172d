package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/mosto-net/mosto/internal/planeval"
	"github.com/mosto-net/mosto/internal/topo"
)

// runPlanEval implements `mosto plan eval`: the seed paper's Fig. 2 and
// number-of-proxies evaluation on the embedded Rocketfuel and Topology Zoo
// graphs, written as an SVG figure and a markdown table.
func runPlanEval(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "plan eval")
	out := fs.String("out", filepath.Join("results", "plan-eval"), "directory for fig2.svg and results.md")
	maxGraphs := fs.Int("max-graphs", 0, "evaluate at most this many graphs (Rocketfuel first, then Topology Zoo); 0 = all")
	minNodes := fs.Int("min-nodes", 7, "smallest graph (locations) to evaluate")
	maxNodes := fs.Int("max-nodes", 115, "largest graph (locations) to evaluate")
	set := fs.String("set", "all", "graph set: all, rocketfuel (the paper's source) or zoo")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mosto plan eval [--out DIR] [--max-graphs N] [--min-nodes N] [--max-nodes N] [--set all|rocketfuel|zoo]\n\n"+
			"Compares mosto's chains with shortest-path and minimax chains for 1, 5 and 10 slow-start rounds\n"+
			"on the embedded Rocketfuel maps (city and router level) and geolocated Topology Zoo graphs,\n"+
			"and writes DIR/fig2.svg and DIR/results.md.\n\nflags:\n")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("plan eval takes no arguments, got %q", pos)
	}
	if *maxGraphs < 0 {
		return usageErrorf("--max-graphs %d: want >= 0", *maxGraphs)
	}
	if *minNodes < 2 || *maxNodes < *minNodes {
		return usageErrorf("--min-nodes %d --max-nodes %d: want 2 <= min <= max", *minNodes, *maxNodes)
	}
	prefix := map[string]string{"all": "", "rocketfuel": "Rocketfuel ", "zoo": "Zoo "}
	want, ok := prefix[*set]
	if !ok {
		return usageErrorf("--set %q: want all, rocketfuel or zoo", *set)
	}
	all, err := topo.EvalGraphs(*minNodes, *maxNodes)
	if err != nil {
		return fmt.Errorf("plan eval: %w", err)
	}
	var graphs []topo.Graph
	for _, g := range all {
		if strings.HasPrefix(g.Name, want) {
			graphs = append(graphs, g)
		}
	}
	if *maxGraphs > 0 && len(graphs) > *maxGraphs {
		graphs = graphs[:*maxGraphs]
	}
	if len(graphs) == 0 {
		return fmt.Errorf("plan eval: no embedded graph has %d to %d locations", *minNodes, *maxNodes)
	}
	res, err := planeval.Run(ctx, graphs, planeval.DefaultRounds())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("plan eval: %w", err)
	}
	svg := filepath.Join(*out, "fig2.svg")
	md := filepath.Join(*out, "results.md")
	if err := writePlanEvalFile(svg, res.WriteSVG); err != nil {
		return err
	}
	if err := writePlanEvalFile(md, res.WriteMarkdown); err != nil {
		return err
	}
	if err := res.WriteSummary(env.Stdout); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "wrote %s and %s\n", svg, md)
	return nil
}

// writePlanEvalFile creates path and fills it with write.
func writePlanEvalFile(path string, write func(w io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plan eval: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("plan eval: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plan eval: write %s: %w", path, err)
	}
	return nil
}
