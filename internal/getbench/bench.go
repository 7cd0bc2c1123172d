package getbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/origin"
)

// Config configures Run.
type Config struct {
	Runs      [4]int   // iterations of multisource, failure, multipath (seed: 30, 20, 4x10), shared
	Scenarios []string // subset of "multisource", "failure", "failure-access", "multipath", "shared", "nginx"; empty: all
	Mosto     string   // mosto binary for the proxies of the multipath scenario
	Aria2     []string // aria2c's settings; nil: Aria2Args
	Dir       string   // work directory (downloads, proxy configs and logs)
	Log       *slog.Logger
	Progress  io.Writer // one line per download; nil: none
}

// Result is one download.
type Result struct {
	Scenario string      `json:"scenario"`
	Mode     string      `json:"mode"`
	Run      int         `json:"run"`
	Seconds  float64     `json:"seconds"`
	Err      string      `json:"error,omitempty"`
	Stats    *mget.Stats `json:"stats,omitempty"`  // mosto get only
	Shared   *Shared     `json:"shared,omitempty"` // the shared scenario
	// SilenceAt is when Paris went silent (seconds from the start), in a
	// failure scenario's runs with the silence.
	SilenceAt float64 `json:"silence_at,omitempty"`
}

// The world: the client in Athens (the seed's subscriber is in Greece),
// sources in Budapest, Paris (the fastest, as the seed's France) and
// Frankfurt, FEPs in Milan and Vienna for the second paths.
const (
	client    = "client"
	portHTTP  = 8080
	portSOCKS = 1080
	portHop   = 7000
)

// Source rates (Mbit/s) on the client's link to each: single-source
// times differ as in the seed (best alone ~4 s for 12 MB).
var sources = []struct {
	host string
	city string
	mbit float64
}{
	{"budapest", "Budapest", 12},
	{"paris", "Paris", 24},
	{"frankfurt", "Frankfurt", 8},
}

// feps carry the second path of a multipath source: client -> fep -> source,
// the client-fep link the path's bottleneck.
var feps = []struct {
	host, city, source string
	mbit               float64
}{
	{"milan", "Milan", "paris", 12},
	{"vienna", "Vienna", "frankfurt", 8},
}

// Spec returns the world of the benchmark.
func Spec() *emu.Spec {
	s := &emu.Spec{Name: "get-bench", Dataset: "wonderproxy"}
	off := false
	s.Offload = &off
	s.Hosts = append(s.Hosts, emu.HostSpec{Name: client, Location: "Athens"})
	for _, src := range sources {
		s.Hosts = append(s.Hosts, emu.HostSpec{Name: src.host, Location: src.city})
		r := src.mbit
		s.Links = append(s.Links, emu.LinkSpec{A: client, B: src.host, RateMbit: &r})
	}
	for _, f := range feps {
		s.Hosts = append(s.Hosts, emu.HostSpec{Name: f.host, Location: f.city})
		r := f.mbit
		s.Links = append(s.Links, emu.LinkSpec{A: client, B: f.host, RateMbit: &r})
	}
	return s
}

// bench is one Run's state.
type bench struct {
	cfg     Config
	w       *emu.World
	origins map[string]*origin.Server
	results []Result
}

// Run brings the world up, runs the scenarios and returns every download.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Scenarios) == 0 {
		cfg.Scenarios = []string{"multisource", "nginx", "failure", "failure-access", "multipath", "shared"}
	}
	for _, tool := range []string{"aria2c", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("getbench: %s not installed: %w", tool, err)
		}
	}
	w, err := emu.Up(ctx, Spec(), cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("getbench: %w", err)
	}
	defer w.Close()
	b := &bench{cfg: cfg, w: w, origins: map[string]*origin.Server{}}
	octx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hosts := []string{"milan"} // the shared scenario's bottleneck source
	for _, src := range sources {
		hosts = append(hosts, src.host)
	}
	done := make(chan error, len(hosts))
	for _, host := range hosts {
		ln, err := w.Listen(ctx, host, "tcp", b.addr(host, portHTTP))
		if err != nil {
			return nil, fmt.Errorf("getbench: %w", err)
		}
		if host == "milan" {
			// The shared scenario measures shares against a loss-based
			// TCP flow (RFC 6356's reference): CUBIC on both sides' senders.
			ln = cubicListener{ln}
		}
		o := origin.New(origin.Config{Seed: 3}, cfg.Log.With("host", host))
		b.origins[host] = o
		go func() { done <- o.Serve(octx, ln) }()
	}
	defer func() {
		cancel()
		for range hosts {
			<-done
		}
	}()
	for _, sc := range cfg.Scenarios {
		var err error
		switch sc {
		case "multisource":
			err = b.multisource(ctx)
		case "failure":
			err = b.failure(ctx)
		case "failure-access":
			err = b.failureAccess(ctx)
		case "multipath":
			err = b.multipath(ctx)
		case "shared":
			err = b.shared(ctx)
		case "nginx":
			err = b.nginx(ctx)
		default:
			err = fmt.Errorf("getbench: unknown scenario %q", sc)
		}
		if err != nil {
			return b.results, err
		}
	}
	return b.results, nil
}

func (b *bench) addr(host string, port int) string {
	return netip.AddrPortFrom(b.w.Addr(host), uint16(port)).String()
}

func (b *bench) url(host string, size int64) string {
	return fmt.Sprintf("http://%s/obj?size=%d", b.addr(host, portHTTP), size)
}

func (b *bench) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return b.w.Dial(ctx, client, network, addr)
}

func (b *bench) record(r Result) {
	b.results = append(b.results, r)
	if b.cfg.Progress != nil {
		st := "ok"
		if r.Err != "" {
			st = "ERROR " + r.Err
		}
		fmt.Fprintf(b.cfg.Progress, "%-11s run %2d %-22s %7.2f s %s\n", r.Scenario, r.Run, r.Mode, r.Seconds, st)
	}
}

// getMosto runs mget in the client's namespace; silence, when set, is
// called once when the download starts.
func (b *bench) getMosto(ctx context.Context, srcs []mget.Source, size int64, silence func()) (float64, *mget.Stats, error) {
	out := filepath.Join(b.cfg.Dir, "mosto.out")
	defer os.Remove(out)
	sum := origin.Sum(3, size)
	start := time.Now()
	if silence != nil {
		silence()
	}
	st, err := mget.Get(ctx, mget.Config{Sources: srcs, Out: out, SHA256: sum[:], Log: b.cfg.Log})
	return time.Since(start).Seconds(), st, err
}

// runTool runs a download tool in the client's namespace and checks the file.
func (b *bench) runTool(ctx context.Context, size int64, silence func(), name string, args ...string) (float64, error) {
	out := filepath.Join(b.cfg.Dir, "tool.out")
	os.Remove(out)
	defer os.Remove(out)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	full := append(args, outArgs(name, out)...)
	cmd := b.w.Command(cctx, client, name, full...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if silence != nil {
		silence()
	}
	err := cmd.Run()
	el := time.Since(start).Seconds()
	if err != nil {
		return el, fmt.Errorf("%s: %v: %s", name, err, tail(stderr.String(), 300))
	}
	return el, checkSum(out, size)
}

func outArgs(tool, out string) []string {
	if tool == "aria2c" {
		return []string{"-d", filepath.Dir(out), "-o", filepath.Base(out)}
	}
	return []string{"-o", out}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func checkSum(path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if want := origin.Sum(3, size); n != size || !strings.EqualFold(hex.EncodeToString(h.Sum(nil)), hex.EncodeToString(want[:])) {
		return fmt.Errorf("%s: %d bytes, SHA-256 mismatch", path, n)
	}
	return nil
}

// Aria2Args are aria2c's settings for this case, the same in every
// scenario: one connection per mirror, the file split in as many parts as
// mirrors (--split=3 --max-connection-per-server=1 --min-split-size=1M),
// the feedback URI selector (mirrors picked by measured speed), and for
// failover a 2 s timeout (mosto get's stall time), no try limit and 1 s
// between retries; no preallocation (--file-allocation=none). Chosen in
// the emulator with nginx mirrors over 7 variants (2 runs each, load
// 17-26): this one 3.02-3.81 s for 12 MB; one connection per mirror in
// order 3.54-3.70 s; two per mirror 3.55-4.25 s; the earlier --split=16
// with 4 connections per mirror and the adaptive selector 4.92-5.38 s
// (it crowds the fastest mirror, whose link is the bottleneck).
var Aria2Args = []string{
	"--split=3", "--max-connection-per-server=1", "--min-split-size=1M", "--uri-selector=feedback",
	"--timeout=2", "--connect-timeout=2", "--max-tries=0", "--retry-wait=1",
	"--file-allocation=none", "--allow-overwrite=true", "--auto-file-renaming=false",
	"--summary-interval=0", "--console-log-level=warn", "--download-result=hide", "--quiet=true",
}

func (b *bench) aria2(ctx context.Context, size int64, silence func(), urls ...string) (float64, error) {
	args := Aria2Args
	if b.cfg.Aria2 != nil {
		args = b.cfg.Aria2
	}
	return b.runTool(ctx, size, silence, "aria2c", append(append([]string(nil), args...), urls...)...)
}

// multisource: 12 MB; each source alone (mosto get), all three (mosto get,
// aria2c) and curl from the best source.
func (b *bench) multisource(ctx context.Context) error {
	const size = 12_000_000
	var urls []string
	for _, s := range sources {
		urls = append(urls, b.url(s.host, size))
	}
	for run := 0; run < b.cfg.Runs[0]; run++ {
		for i, s := range sources {
			el, st, err := b.getMosto(ctx, []mget.Source{{URL: urls[i], Dial: b.dial}}, size, nil)
			b.record(result("multisource", "single "+s.city, run, el, st, err))
		}
		var srcs []mget.Source
		for _, u := range urls {
			srcs = append(srcs, mget.Source{URL: u, Dial: b.dial})
		}
		el, st, err := b.getMosto(ctx, srcs, size, nil)
		b.record(result("multisource", "mosto get", run, el, st, err))
		el, err = b.aria2(ctx, size, nil, urls...)
		b.record(result("multisource", "aria2c", run, el, nil, err))
		el, err = b.runTool(ctx, size, nil, "curl", "-s", "-S", "-f", urls[1])
		b.record(result("multisource", "curl Paris", run, el, nil, err))
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// silence is how long Paris is silent in the failure scenarios (seed 003).
const silence = 7 * time.Second

// failure: 50 MB from the three sources; Paris (the fastest) silent for 7 s
// from 20% of the same tool's no-failure time in the same iteration.
func (b *bench) failure(ctx context.Context) error { return b.failureIn(ctx, "failure") }

// failureIn runs the failure scenario in b's world, recorded as sc.
func (b *bench) failureIn(ctx context.Context, sc string) error {
	const size = 50_000_000
	var urls []string
	var srcs []mget.Source
	for _, s := range sources {
		urls = append(urls, b.url(s.host, size))
		srcs = append(srcs, mget.Source{URL: b.url(s.host, size), Dial: b.dial})
	}
	paris := b.origins["paris"]
	silenceAt := func(normal float64) (func(), func(), float64) {
		var t *time.Timer
		at := 0.2 * normal
		return func() {
				t = time.AfterFunc(time.Duration(at*float64(time.Second)), func() { paris.Silence(silence) })
			}, func() {
				t.Stop()
				paris.Silence(0)
			}, at
	}
	for run := 0; run < b.cfg.Runs[1]; run++ {
		el, st, err := b.getMosto(ctx, srcs, size, nil)
		b.record(result(sc, "mosto get", run, el, st, err))
		start, stop, at := silenceAt(el)
		el2, st2, err := b.getMosto(ctx, srcs, size, start)
		stop()
		r := result(sc, "mosto get, Paris silent", run, el2, st2, err)
		r.SilenceAt = at
		b.record(r)
		el, err = b.aria2(ctx, size, nil, urls...)
		b.record(result(sc, "aria2c", run, el, nil, err))
		start, stop, at = silenceAt(el)
		el2, err = b.aria2(ctx, size, start, urls...)
		stop()
		r = result(sc, "aria2c, Paris silent", run, el2, nil, err)
		r.SilenceAt = at
		b.record(r)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// multipath: 50 MB from Paris and Frankfurt, one path each (direct) against
// two each (direct + through the mosto proxy in Milan / Vienna).
func (b *bench) multipath(ctx context.Context) error {
	const size = 50_000_000
	stop, err := b.startProxies(ctx)
	if err != nil {
		return err
	}
	defer stop()
	var one, two []mget.Source
	for _, f := range feps {
		u := b.url(f.source, size)
		one = append(one, mget.Source{URL: u, Dial: b.dial})
		two = append(two, mget.Source{URL: u, Dial: b.dial},
			mget.Source{URL: u, Path: "via " + f.city, Dial: mget.ViaSOCKS5(b.addr(f.host, portSOCKS), b.dial)})
	}
	for run := 0; run < b.cfg.Runs[2]; run++ {
		el, st, err := b.getMosto(ctx, one, size, nil)
		b.record(result("multipath", "1 path per source", run, el, st, err))
		el, st, err = b.getMosto(ctx, two, size, nil)
		b.record(result("multipath", "2 paths per source", run, el, st, err))
		if run == 0 && err == nil {
			// Congest the Milan chain (its client link to a quarter) from
			// 30% to 70% of the transfer: its sub-flow must shrink its share
			// and the others take over (the rate plot).
			congest, restore := b.congest(feps[0].host, el)
			el2, st2, err := b.getMosto(ctx, two, size, congest)
			restore()
			b.record(result("multipath", "2 paths, Milan chain congested", run, el2, st2, err))
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// shared: 16 MB from an origin in Milan over one sub-flow, two independent
// ones or two coupled ones, beside one competing TCP flow from Milan on the
// same link (12 Mbit/s, its queue cut to 20 ms for the scenario), and from
// Frankfurt (8 Mbit/s, disjoint) over one sub-flow.
func (b *bench) shared(ctx context.Context) error {
	const size = 16_000_000
	orig, err := b.w.Link(client, "milan")
	if err != nil {
		return err
	}
	l := orig
	l.QueueMS = 20
	if err := b.w.SetLink(client, "milan", l); err != nil {
		return err
	}
	defer b.w.SetLink(client, "milan", orig)
	out := filepath.Join(b.cfg.Dir, "shared.out")
	for run := 0; run < b.cfg.Runs[3]; run++ {
		for _, mode := range []SharedMode{OnePath, TwoCoupled, TwoPaths} {
			r, err := SharedBottleneck(ctx, b.dial, b.url("milan", size), b.url("frankfurt", size), b.url("milan", 1<<30), size, mode, out)
			res := result("shared", mode.String(), run, r.Seconds, r.Stats, err)
			res.Shared = &r
			b.record(res)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// congest returns a start function that cuts the client-fep link to a
// quarter of its rate from 30% to 70% of normal seconds, and a restore.
func (b *bench) congest(fep string, normal float64) (func(), func()) {
	orig, _ := b.w.Link(client, fep)
	low := orig
	low.RateMbit = orig.RateMbit / 4
	var t1, t2 *time.Timer
	d := func(f float64) time.Duration { return time.Duration(f * normal * float64(time.Second)) }
	return func() {
			t1 = time.AfterFunc(d(0.3), func() { b.w.SetLink(client, fep, low) })
			t2 = time.AfterFunc(d(0.7), func() { b.w.SetLink(client, fep, orig) })
		}, func() {
			t1.Stop()
			t2.Stop()
			b.w.SetLink(client, fep, orig)
		}
}

// startProxies runs `mosto proxy` in each FEP with a SOCKS5 entry; with no
// chain table the FEP connects to the source itself (a one-proxy chain).
func (b *bench) startProxies(ctx context.Context) (func(), error) {
	if b.cfg.Mosto == "" {
		return nil, errors.New("getbench: no mosto binary for the proxies")
	}
	var cmds []*exec.Cmd
	stop := func() {
		for _, c := range cmds {
			c.Process.Signal(os.Interrupt)
			c.Wait()
		}
	}
	for _, f := range feps {
		cfg := map[string]any{
			"id":           f.host,
			"hop":          map[string]string{"listen": b.addr(f.host, portHop)},
			"members":      map[string]string{f.host: b.addr(f.host, portHop)},
			"keys":         map[string]any{"current": map[string]any{"id": 1, "secret_hex": strings.Repeat("ab", 32)}},
			"destinations": map[string]any{"allow": []string{"10.77.0.0/16"}},
			"socks5":       map[string]any{"listen": b.addr(f.host, portSOCKS), "allow_open": true}, // an emulated lab
			"loops":        -1,
		}
		y, err := yaml.Marshal(cfg)
		if err != nil {
			stop()
			return nil, err
		}
		path := filepath.Join(b.cfg.Dir, "proxy-"+f.host+".yaml")
		if err := os.WriteFile(path, y, 0o600); err != nil {
			stop()
			return nil, err
		}
		lf, err := os.Create(filepath.Join(b.cfg.Dir, "proxy-"+f.host+".log"))
		if err != nil {
			stop()
			return nil, err
		}
		cmd := b.w.Command(context.Background(), f.host, b.cfg.Mosto, "proxy", "--config", path)
		cmd.Stdout, cmd.Stderr = lf, lf
		if err := cmd.Start(); err != nil {
			lf.Close()
			stop()
			return nil, fmt.Errorf("getbench: proxy %s: %w", f.host, err)
		}
		lf.Close()
		cmds = append(cmds, cmd)
	}
	for _, f := range feps {
		deadline := time.Now().Add(15 * time.Second)
		for {
			c, err := b.w.Dial(ctx, client, "tcp", b.addr(f.host, portSOCKS))
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				stop()
				return nil, fmt.Errorf("getbench: proxy %s does not accept (log %s): %w", f.host, filepath.Join(b.cfg.Dir, "proxy-"+f.host+".log"), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return stop, nil
}

func result(sc, mode string, run int, el float64, st *mget.Stats, err error) Result {
	r := Result{Scenario: sc, Mode: mode, Run: run, Seconds: el, Stats: st}
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

// Ideal returns the time the sum of the multisource sources' rates allows
// for size bytes (no RTT, no slow start).
func Ideal(size int64) float64 {
	var mbit float64
	for _, s := range sources {
		mbit += s.mbit
	}
	return float64(size) * 8 / (mbit * 1e6)
}
