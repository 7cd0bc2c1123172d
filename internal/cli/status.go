package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/dashboard"
	"github.com/mosto-net/mosto/internal/transfer"
)

// runStatus implements `mosto status`: the dashboard's information in the
// terminal, read from a controller's dashboard listener (--ui-listen).
func runStatus(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "status")
	base := fs.String("url", "http://127.0.0.1:7080", "the controller's dashboard URL (mosto controller --ui-listen)")
	authFile := fs.String("auth-file", "", "file with USER:PASSWORD of the dashboard (its --ui-auth-file)")
	pair := fs.String("pair", "", "FROM,TO: also print the chains of this InP -> EgP pair")
	lop := fs.String("lop", "", "the LoP whose table holds --pair (default: FROM)")
	asJSON := fs.Bool("json", false, "print the state as JSON instead of tables")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto status [--url http://HOST:PORT] [--auth-file FILE] [--pair FROM,TO [--lop ID]] [--json]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	u, err := url.Parse(*base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageErrorf("--url %q: want http://host:port", *base)
	}
	var from, to string
	if *pair != "" {
		var ok bool
		if from, to, ok = strings.Cut(*pair, ","); !ok || api.ValidateID(from) != nil || api.ValidateID(to) != nil {
			return usageErrorf("--pair %q: want FROM,TO (two FEP ids)", *pair)
		}
		if *lop == "" {
			*lop = from
		}
	}
	if *lop != "" && api.ValidateID(*lop) != nil {
		return usageErrorf("--lop %q: not a FEP id", *lop)
	}
	var user, pass string
	if *authFile != "" {
		if user, pass, err = readBasicAuth(*authFile); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	get := func(path string, v any) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(*base, "/")+path, nil)
		if err != nil {
			return err
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return fmt.Errorf("status: GET %s: %w", path, err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status: GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
		}
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("status: GET %s: %w", path, err)
		}
		return nil
	}
	var st dashboard.State
	if err := get("/ui/state", &st); err != nil {
		return err
	}
	var tab *api.Table
	if *pair != "" {
		tab = new(api.Table)
		if err := get("/ui/table/"+url.PathEscape(*lop), tab); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return writeStatus(env.Stdout, &st, tab, from, to)
}

// writeStatus prints a State (and the chains of from -> to in tab) as text.
func writeStatus(w io.Writer, st *dashboard.State, tab *api.Table, from, to string) error {
	c := st.Controller
	leader := "no (follower)"
	if c.Leader {
		leader = "yes"
	}
	key := "no key yet"
	if !c.KeysRotated.IsZero() {
		key = (time.Duration(c.KeyAgeS) * time.Second).Round(time.Second).String()
	}
	store := c.Store
	if store == "" {
		store = "unknown"
	}
	fmt.Fprintf(w, "controller: leader %s, store %s, table version %d, %d FEPs, key age %s, at %s\n\n",
		leader, store, c.Version, c.FEPs, key, st.At.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FEP\tlocation\tstatus\tlast report\tflows/s\tbytes/s\tactive\trefusals\tdirect\ttable")
	for _, f := range st.FEPs {
		last, tv := "-", "-"
		if !f.LastReport.IsZero() {
			last = st.At.Sub(f.LastReport).Round(time.Second).String() + " ago"
		}
		direct := fmt.Sprint(f.Direct)
		if f.Stats != nil {
			tv = fmt.Sprint(f.Stats.TableVersion)
			if s := kvString(f.Stats.Direct); s != "" {
				direct = s
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%.0f\t%.0f\t%.0f\t%s\t%s\n", f.ID, f.Location, f.Status, last,
			f.FlowsPerS, f.BytesPerS, f.Active, f.Refusals, direct, tv)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if tab != nil {
		fmt.Fprintf(w, "\nchains %s -> %s (LoP %s, table v%d):\n", from, to, tab.LoP, tab.Version)
		n := 0
		for _, e := range tab.Table.Chains {
			if e.From != from || e.To != to {
				continue
			}
			n++
			fmt.Fprintf(w, "  up to %s (%d rounds): %s  cost %.1f ms (sum RTT %.1f, max RTT %.1f)\n",
				transfer.FormatSize(e.Size), e.Rounds, strings.Join(e.Path, " -> "), e.CostMS, e.SumMS, e.MaxMS)
		}
		if n == 0 {
			fmt.Fprintf(w, "  none: LoP %s has no chain %s -> %s (another LoP serves %s? try --lop)\n", tab.LoP, from, to, from)
		}
	}
	if len(st.Changes) > 0 {
		fmt.Fprintln(w, "\nrecent RTT changes:")
		for i, ch := range st.Changes {
			if i == 10 {
				break
			}
			fmt.Fprintf(w, "  %s  %s -> %s: %s -> %s ms\n", ch.At.Format(time.TimeOnly), ch.From, ch.To, msString(ch.OldMS), msString(ch.NewMS))
		}
	}
	return nil
}

func msString(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func kvString(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%.0f", k, m[k]))
		}
	}
	return strings.Join(parts, " ")
}
