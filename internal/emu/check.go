package emu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os/exec"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// CheckSections lists the parts of Check, in order.
var CheckSections = []string{"rtt", "tput", "rate", "loss", "reorder", "scale", "fig0a"}

// CheckOptions selects what Check measures.
type CheckOptions struct {
	Sections []string // subset of CheckSections; empty = all
	Quick    bool     // fewer samples and shorter runs
	Log      *slog.Logger
}

// Check measures the emulator's fidelity figures (issue 3) and prints them
// to out as tables. It needs root; throughput figures use iperf3 when it is
// installed, so the CPU reported is the emulator's alone.
func Check(ctx context.Context, out io.Writer, opt CheckOptions) error {
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	secs := opt.Sections
	if len(secs) == 0 {
		secs = CheckSections
	}
	for _, s := range secs {
		if !slices.Contains(CheckSections, s) {
			return fmt.Errorf("emu: check: unknown section %q (have %s)", s, strings.Join(CheckSections, ", "))
		}
	}
	c := &checker{out: out, opt: opt}
	run := map[string]func(context.Context) error{
		"rtt": c.rtt, "tput": c.tput, "rate": c.rate, "loss": c.loss,
		"reorder": c.reorder, "scale": c.scale, "fig0a": c.fig0a,
	}
	var errs []error
	for _, s := range CheckSections {
		if !slices.Contains(secs, s) {
			continue
		}
		if err := run[s](ctx); err != nil {
			fmt.Fprintf(out, "%s: error: %v\n\n", s, err)
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

type checker struct {
	out io.Writer
	opt CheckOptions
}

func (c *checker) table() *tabwriter.Writer {
	return tabwriter.NewWriter(c.out, 0, 0, 2, ' ', tabwriter.AlignRight)
}

func (c *checker) pair(ctx context.Context, extra string) (*World, error) {
	spec, err := ParseSpec([]byte("name: check\nhosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 1}]\n" + extra))
	if err != nil {
		return nil, err
	}
	return Up(ctx, spec, c.opt.Log)
}

func okMark(ok bool) string {
	if ok {
		return "ok"
	}
	return "OUT"
}

func (c *checker) rtt(ctx context.Context) error {
	w, err := c.pair(ctx, "")
	if err != nil {
		return err
	}
	defer w.Close()
	fmt.Fprintln(c.out, "RTT fidelity (ICMP echo and TCP handshake; min and median of N; bound 0.5 ms + 2%)")
	tw := c.table()
	fmt.Fprintln(tw, "RTT ms\tN\ticmp min\ticmp med\ttcp min\ttcp med\tbound\t\t")
	for _, rtt := range []float64{1, 5, 10, 20, 50, 100, 200, 500} {
		if err := w.SetLink("a", "b", Link{DelayMS: rtt / 2}); err != nil {
			return err
		}
		n := 20
		if rtt >= 100 || c.opt.Quick {
			n = 5
		}
		want := time.Duration(rtt * 1e6)
		ping, err := w.Ping(ctx, "a", "b", n, 10*time.Millisecond)
		if err != nil {
			return err
		}
		tcp, err := w.ConnectRTT(ctx, "a", "b", n)
		if err != nil {
			return err
		}
		tol := tolerance(want)
		ok := absDur(ping.Min()-want) <= tol && absDur(tcp.Min()-want) <= tol
		fmt.Fprintf(tw, "%g\t%d\t%s\t%s\t%s\t%s\t+-%s\t%s\t\n", rtt, n, ms(ping.Min()), ms(ping.Median()), ms(tcp.Min()), ms(tcp.Median()), ms(tol), okMark(ok))
	}
	tw.Flush()
	fmt.Fprintln(c.out)
	return nil
}

// tolerance is the RTT fidelity bound of issue 3: 0.5 ms + 2%.
func tolerance(want time.Duration) time.Duration {
	return 500*time.Microsecond + want/50
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// iperfResult is what one iperf3 run reported plus the emulator's CPU.
type iperfResult struct {
	Mbit       float64 // receiver goodput
	MedianMbit float64 // median of the 1 s intervals measured at the receiver (with reverse)
	Retrans    int
	CPUPercent float64 // this process (the emulator), % of one core
}

// iperf runs iperf3 from client to server for secs seconds (omitting the
// first second) and measures this process's CPU meanwhile.
// With reverse the server sends and the client's intervals are measured
// where the data arrives.
func (w *World) iperf(ctx context.Context, client, server string, secs int, reverse bool) (iperfResult, error) {
	var res iperfResult
	if _, err := exec.LookPath("iperf3"); err != nil {
		return res, errors.New("iperf3 is not installed")
	}
	addr := w.Addr(server).String()
	// In a real-time world the endpoints run at SCHED_FIFO priority 5
	// (below the emulator's threads): the figures are then the
	// emulator's, not the host scheduler's. A starved iperf3 leaves the
	// link idle (sender) or reads in bursts (receiver): a loaded CI run
	// measured 17.2 Mbit/s through a 20 Mbit/s link.
	iperf3 := func(host string, args ...string) *exec.Cmd {
		if w.realtime {
			if chrt, err := exec.LookPath("chrt"); err == nil {
				return w.Command(ctx, host, chrt, append([]string{"-f", "5", "iperf3"}, args...)...)
			}
		}
		return w.Command(ctx, host, "iperf3", args...)
	}
	srv := iperf3(server, "-s", "-1", "-B", addr)
	if err := srv.Start(); err != nil {
		return res, fmt.Errorf("start iperf3 server: %w", err)
	}
	defer func() {
		srv.Process.Kill()
		srv.Wait()
	}()
	var out []byte
	var err error
	var ru0, ru1 unix.Rusage
	var t0 time.Time
	// Until the server listens: starting it takes seconds on a loaded
	// machine (a run at load 60 gave up after 2 s with "connection refused").
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		unix.Getrusage(unix.RUSAGE_SELF, &ru0)
		t0 = time.Now()
		args := []string{"-c", addr, "-t", fmt.Sprint(secs), "-O", "1", "-J"}
		if reverse {
			args = append(args, "-R")
		}
		// "unable to connect to server" comes in the JSON's error field,
		// with exit status 0 or 1 (both seen): the server is not up yet.
		out, err = iperf3(client, args...).Output()
		if !strings.Contains(string(out), "unable to connect") {
			break
		}
	}
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	wall := time.Since(t0)
	if err != nil {
		return res, fmt.Errorf("iperf3 client: %v: %s", err, firstLine(out))
	}
	var j struct {
		End struct {
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Intervals []struct {
			Sum struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				Omitted       bool    `json:"omitted"`
			} `json:"sum"`
		} `json:"intervals"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &j); err != nil {
		return res, fmt.Errorf("iperf3 output: %w", err)
	}
	if j.Error != "" {
		return res, fmt.Errorf("iperf3: %s", j.Error)
	}
	cpu := time.Duration(unix.TimevalToNsec(ru1.Utime) - unix.TimevalToNsec(ru0.Utime) + unix.TimevalToNsec(ru1.Stime) - unix.TimevalToNsec(ru0.Stime))
	res.Mbit = j.End.SumReceived.BitsPerSecond / 1e6
	res.Retrans = j.End.SumSent.Retransmits
	var iv []float64
	for _, in := range j.Intervals {
		if !in.Sum.Omitted {
			iv = append(iv, in.Sum.BitsPerSecond/1e6)
		}
	}
	if len(iv) > 0 {
		slices.Sort(iv)
		res.MedianMbit = iv[len(iv)/2]
	}
	res.CPUPercent = 100 * cpu.Seconds() / wall.Seconds()
	return res, nil
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func (c *checker) tput(ctx context.Context) error {
	fmt.Fprintln(c.out, "Single-flow throughput on a clean 50 ms RTT link (iperf3, cubic and bbr; CPU = emulator process)")
	tw := c.table()
	fmt.Fprint(tw, "cc\toffload\tGbit/s\tretrans\temu CPU pct-core\tcore-s per Gbit\t\t\n")
	secs := 5
	if c.opt.Quick {
		secs = 3
	}
	for _, off := range []bool{true, false} {
		for _, cc := range []string{"cubic", "bbr"} {
			w, err := c.pair(ctx, fmt.Sprintf("tcp: {congestion: %s}\noffload: %v\n", cc, off))
			if err != nil {
				return err
			}
			w.SetLink("a", "b", Link{DelayMS: 25})
			r, err := w.iperf(ctx, "a", "b", secs, false)
			w.Close()
			if err != nil {
				return err
			}
			perG := r.CPUPercent / 100 / (r.Mbit / 1000)
			fmt.Fprintf(tw, "%s\t%v\t%.2f\t%d\t%.0f\t%.2f\t%s\t\n", cc, off, r.Mbit/1000, r.Retrans, r.CPUPercent, perG, okMark(!off || r.Mbit >= 1000))
		}
	}
	tw.Flush()
	fmt.Fprintln(c.out)
	return nil
}

func (c *checker) rate(ctx context.Context) error {
	fmt.Fprintln(c.out, "Rate limit accuracy (10 ms RTT, 100 ms queue, cubic; iperf3 -R: goodput = median of the 1 s intervals at the receiver; expected = rate * 1448/1500 payload)")
	tw := c.table()
	fmt.Fprint(tw, "rate Mbit/s\tgoodput\texpected\terror %\tretrans\temu CPU pct-core\t\t\n")
	secs := 5
	if c.opt.Quick {
		secs = 3
	}
	for _, rate := range []float64{10, 50, 100, 500, 1000} {
		w, err := c.pair(ctx, "tcp: {congestion: cubic}\n")
		if err != nil {
			return err
		}
		w.SetLink("a", "b", Link{DelayMS: 5, RateMbit: rate})
		r, err := w.iperf(ctx, "b", "a", secs, true)
		w.Close()
		if err != nil {
			return err
		}
		want := rate * 1448 / 1500
		e := 100 * (r.MedianMbit - want) / want
		fmt.Fprintf(tw, "%g\t%.1f\t%.1f\t%+.1f\t%d\t%.0f\t%s\t\n", rate, r.MedianMbit, want, e, r.Retrans, r.CPUPercent, okMark(e >= -5 && e <= 5))
	}
	tw.Flush()
	fmt.Fprintln(c.out)
	return nil
}

func (c *checker) loss(ctx context.Context) error {
	fmt.Fprintln(c.out, "Loss accuracy: UDP datagrams end to end, and TCP segments (offload on, GSO split in the emulator)")
	tw := c.table()
	fmt.Fprintln(tw, "loss %\tUDP sent\tUDP lost %\tTCP segments\tTCP dropped %\t\t")
	n := 20000
	if c.opt.Quick {
		n = 5000
	}
	for _, p := range []float64{0.1, 1, 5, 20} {
		w, err := c.pair(ctx, "tcp: {congestion: cubic}\n")
		if err != nil {
			return err
		}
		w.SetLinkDir("a", "b", Link{DelayMS: 1, LossPct: p})
		got, _, err := w.UDPLoss(ctx, "a", "b", n, 200, 50*time.Microsecond)
		if err != nil {
			w.Close()
			return err
		}
		udp := 100 * float64(n-got) / float64(n)
		if p > 5 {
			w.Close()
			fmt.Fprintf(tw, "%g\t%d\t%.3f\t-\t-\t%s\t\n", p, n, udp, okMark(lossOK(udp, p, n)))
			continue
		}
		// TCP: data flows a -> b; only that direction is lossy.
		if _, err := w.Fetch(ctx, "b", "a", 8<<20); err != nil {
			w.Close()
			return err
		}
		st := w.Stats("a", "b")
		w.Close()
		// The UDP run's datagrams are in the same counters: subtract them.
		segs := st.Packets + st.LossDrops - uint64(n)
		drops := st.LossDrops - uint64(n-got)
		tcp := 100 * float64(drops) / float64(segs)
		ok := lossOK(udp, p, n) && lossOK(tcp, p, int(segs))
		fmt.Fprintf(tw, "%g\t%d\t%.3f\t%d\t%.3f\t%s\t\n", p, n, udp, segs, tcp, okMark(ok))
	}
	tw.Flush()
	fmt.Fprintln(c.out, "(ok = within 10% relative or, for small samples, 3 standard deviations of the binomial)")
	fmt.Fprintln(c.out)
	return nil
}

// lossOK reports whether a measured loss percentage over n packets is
// within 10% (relative) of want, or within 3 binomial standard deviations
// when n is too small for 10% to be meaningful.
func lossOK(got, want float64, n int) bool {
	p := want / 100
	sd := 100 * math.Sqrt(p*(1-p)/float64(n))
	return math.Abs(got-want) <= max(want*0.1, 3*sd)
}

func (c *checker) reorder(ctx context.Context) error {
	fmt.Fprintln(c.out, "Reordering (5000 UDP datagrams sent back to back, 5 ms one-way)")
	tw := c.table()
	fmt.Fprintln(tw, "link\treceived\treordered\t\t")
	for _, tt := range []struct {
		name string
		l    Link
		want bool
	}{
		{"no jitter", Link{DelayMS: 5}, false},
		{"jitter 2 ms, reorder: false", Link{DelayMS: 5, JitterMS: 2}, false},
		{"jitter 2 ms, reorder: true", Link{DelayMS: 5, JitterMS: 2, Reorder: true}, true},
	} {
		w, err := c.pair(ctx, "")
		if err != nil {
			return err
		}
		w.SetLink("a", "b", tt.l)
		got, re, err := w.UDPLoss(ctx, "a", "b", 5000, 100, 10*time.Microsecond)
		w.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t\n", tt.name, got, re, okMark((re > 0) == tt.want))
	}
	tw.Flush()
	fmt.Fprintln(c.out)
	return nil
}

func (c *checker) scale(ctx context.Context) error {
	fmt.Fprintln(c.out, "Scale: worlds on the 30-city default dataset (100 hosts: cities repeated, 10 ms between copies)")
	tw := c.table()
	fmt.Fprintln(tw, "hosts\tup s\tdown s\tpings ok\t\t")
	for _, n := range []int{30, 100} {
		spec := scaleSpec(n)
		start := time.Now()
		w, err := Up(ctx, spec, c.opt.Log)
		if err != nil {
			return err
		}
		up := time.Since(start)
		hosts := w.Hosts()
		okPings := 0
		pairs := [][2]string{{hosts[0], hosts[n-1]}, {hosts[1], hosts[n/2]}, {hosts[n-2], hosts[3]}}
		for _, p := range pairs {
			s, err := w.Ping(ctx, p[0], p[1], 2, time.Millisecond)
			want := w.RTT(p[0], p[1])
			if err == nil && absDur(s.Min()-want) <= tolerance(want)+time.Millisecond {
				okPings++
			}
		}
		start = time.Now()
		if err := w.Close(); err != nil {
			return err
		}
		down := time.Since(start)
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%d/%d\t%s\t\n", n, up.Seconds(), down.Seconds(), okPings, len(pairs), okMark(okPings == len(pairs) && (n > 30 || (up <= 5*time.Second && down <= 5*time.Second))))
	}
	tw.Flush()
	fmt.Fprintln(c.out)
	return nil
}

// scaleSpec builds an n-host world on the default dataset; beyond 30 hosts
// cities repeat and copies of one city are 10 ms RTT apart.
func scaleSpec(n int) *Spec {
	var b strings.Builder
	fmt.Fprintf(&b, "name: scale%d\ndataset: default\nhosts:\n", n)
	cities := defaultCities()
	for i := range n {
		fmt.Fprintf(&b, "  - {name: h%d, location: %s}\n", i, cities[i%len(cities)])
	}
	b.WriteString("links:\n")
	for i := range n {
		for j := i + 1; j < n; j++ {
			if i%len(cities) == j%len(cities) {
				fmt.Fprintf(&b, "  - {a: h%d, b: h%d, delay_ms: 5}\n", i, j)
			}
		}
	}
	s, err := ParseSpec([]byte(b.String()))
	if err != nil {
		panic(fmt.Sprintf("emu: scale spec: %v", err)) // the spec is built here: a bug
	}
	return s
}

func defaultCities() []string {
	m, _ := loadDataset("default")
	return m.Names
}

func (c *checker) fig0a(ctx context.Context) error {
	const rttMS, rate = 100, 100.0
	runs := 3
	if c.opt.Quick {
		runs = 1
	}
	fmt.Fprintf(c.out, "Fig. 0a cross-check: one link, %d ms RTT, %g Mbit/s, cubic, initcwnd 10; request to last byte, median of %d\n", rttMS, rate, runs)
	fmt.Fprintln(c.out, "ideal = RTT + size/rate; model = r*RTT + size/rate with r = pathcomp.Model{}.Rounds(size) slow-start rounds")
	w, err := c.pair(ctx, "tcp: {congestion: cubic, initcwnd: 10}\n")
	if err != nil {
		return err
	}
	defer w.Close()
	w.SetLink("a", "b", Link{DelayMS: rttMS / 2, RateMbit: rate})
	tw := c.table()
	fmt.Fprintln(tw, "size KB\tideal ms\trounds\tmodel ms\tmeasured ms\tmeas/ideal\tmeas/model\t")
	rtt := float64(rttMS)
	for _, kb := range []int64{10, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000} {
		size := kb * 1000
		var ds Samples
		for range runs {
			r, err := w.Fetch(ctx, "b", "a", size)
			if err != nil {
				return err
			}
			ds = append(ds, r.Time)
		}
		ser := float64(size) * 8 / (rate * 1e3) // ms
		ideal := rtt + ser
		rounds := pathcomp.Model{}.Rounds(size)
		model := float64(rounds)*rtt + ser
		meas := float64(ds.Median()) / 1e6
		fmt.Fprintf(tw, "%d\t%.0f\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t\n", kb, ideal, rounds, model, meas, meas/ideal, meas/model)
	}
	tw.Flush()
	fmt.Fprintln(c.out)
	return nil
}
