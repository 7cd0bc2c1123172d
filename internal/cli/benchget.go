package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/mosto-net/mosto/internal/getbench"
)

// runBenchGet is `mosto bench get`: seed 003's scenarios in the emulator.
func runBenchGet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "bench get")
	runs1 := fs.Int("runs-multisource", 30, "iterations of the multi-source scenario (seed: 30)")
	runs2 := fs.Int("runs-failure", 20, "iterations of each failure scenario, failure and failure-access (seed: 20)")
	runs3 := fs.Int("runs-multipath", 40, "iterations of the multipath scenario (seed: 4 x 10)")
	runs4 := fs.Int("runs-shared", 5, "iterations of the shared-bottleneck scenario (coupled congestion control)")
	aria2 := fs.String("aria2", "", "aria2c's settings, space-separated (default: getbench.Aria2Args)")
	quick := fs.Int("quick", 0, "if > 0, this many iterations of every scenario")
	only := fs.String("scenarios", "", "comma-separated subset of multisource,nginx,failure,failure-access,multipath,shared (nginx: multisource with nginx mirrors, --runs-multisource iterations; failure-access: the failure scenario behind a shared access link, as the seed's world)")
	out := fs.String("out", "", "write the markdown report here (default: stdout)")
	svg := fs.String("svg", "", "write the per-sub-flow rate plot of a failure run here (seed Fig. 5), and of the congested-chain and failure-access runs beside it (NAME-congested.svg, NAME-access.svg)")
	jsonOut := fs.String("json", "", "write every download (with mosto get's stats) here")
	dir := fs.String("dir", "", "work directory (default: a temporary one)")
	from := fs.String("from-json", "", "comma-separated --json files of earlier runs: write the report (and --json) of their downloads together, iterations renumbered in file order; no emulator is run")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *from != "" {
		rs, err := loadBenchGet(strings.Split(*from, ","))
		if err != nil {
			return err
		}
		return writeBenchGet(env, args, rs, *out, *svg, *jsonOut, nil)
	}
	cfg := getbench.Config{Runs: [4]int{*runs1, *runs2, *runs3, *runs4}, Log: env.Log, Progress: env.Stderr}
	if *quick > 0 {
		cfg.Runs = [4]int{*quick, *quick, *quick, *quick}
	}
	if *aria2 != "" {
		cfg.Aria2 = strings.Fields(*aria2)
	}
	if *only != "" {
		cfg.Scenarios = strings.Split(*only, ",")
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench get: %w", err)
	}
	cfg.Mosto = exe
	cfg.Dir = *dir
	if cfg.Dir == "" {
		if cfg.Dir, err = os.MkdirTemp("", "mosto-bench-get-"); err != nil {
			return fmt.Errorf("bench get: %w", err)
		}
		defer os.RemoveAll(cfg.Dir)
	}
	rs, err := getbench.Run(ctx, cfg)
	return writeBenchGet(env, args, rs, *out, *svg, *jsonOut, err)
}

// loadBenchGet reads the downloads of earlier `bench get --json` runs, each
// file's iterations numbered after the previous file's.
func loadBenchGet(paths []string) ([]getbench.Result, error) {
	var all []getbench.Result
	next := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("bench get: %w", err)
		}
		var rs []getbench.Result
		if err := json.Unmarshal(b, &rs); err != nil {
			return nil, fmt.Errorf("bench get: %s: %w", p, err)
		}
		last := next - 1
		for _, r := range rs {
			r.Run += next
			last = max(last, r.Run)
			all = append(all, r)
		}
		next = last + 1
	}
	return all, nil
}

// writeBenchGet writes the report, plots and JSON of the downloads rs; err
// is the run's error, returned unless nil (then the first write error is).
func writeBenchGet(env *Env, args []string, rs []getbench.Result, out, svg, jsonOut string, err error) error {
	if len(rs) > 0 {
		w := env.Stdout
		if out != "" {
			f, ferr := os.Create(out)
			if ferr != nil {
				return fmt.Errorf("bench get: %w", ferr)
			}
			defer f.Close()
			w = f
		}
		fmt.Fprintf(w, "Command: `mosto bench get %s`\n\n", strings.Join(args, " "))
		if werr := getbench.WriteMarkdown(w, rs); werr != nil && err == nil {
			err = werr
		}
		if svg != "" {
			if p, ok := getbench.RatePlot(rs, "failure", "mosto get, Paris silent", "mosto get, 50 MB from 3 sources, Paris silent for 7 s from 20%"); ok {
				if serr := writeSVG(svg, p.WriteSVG); serr != nil && err == nil {
					err = serr
				}
			}
		}
		if svg != "" {
			path := strings.TrimSuffix(svg, ".svg") + "-congested.svg"
			if p, ok := getbench.RatePlot(rs, "multipath", "2 paths, Milan chain congested", "mosto get, 50 MB, 2 sources x 2 paths, the Milan chain cut to a quarter from 30% to 70%"); ok {
				if serr := writeSVG(path, p.WriteSVG); serr != nil && err == nil {
					err = serr
				}
			}
		}
		if svg != "" {
			path := strings.TrimSuffix(svg, ".svg") + "-access.svg"
			if p, ok := getbench.RatePlot(rs, "failure-access", "mosto get, Paris silent", "mosto get, 50 MB from 3 sources behind a shared access link, Paris silent for 7 s from 20%"); ok {
				if serr := writeSVG(path, p.WriteSVG); serr != nil && err == nil {
					err = serr
				}
			}
		}
		if jsonOut != "" {
			b, _ := json.MarshalIndent(rs, "", " ")
			if jerr := os.WriteFile(jsonOut, b, 0o644); jerr != nil && err == nil {
				err = jerr
			}
		}
	}
	return err
}

func writeSVG(path string, write func(w io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
