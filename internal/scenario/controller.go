package scenario

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
)

// Ports of the controller mode.
const (
	controllerPort = 7443
	probePort      = 7001
)

// ControllerConfig runs a real `mosto controller` in the world: the proxies
// join it over mutual TLS, measure each other and follow its tables.
type ControllerConfig struct {
	// Host runs the controller (a FEP host shares it); empty: the first FEP.
	Host string
	// ProbeInterval is the agents' probe round interval; 0: 2s.
	ProbeInterval time.Duration
	// Debounce is the controller's --debounce; 0: 300ms.
	Debounce time.Duration
	// Converge bounds the wait for discovery to converge; 0: 60s.
	Converge time.Duration
	// Args are more flags of `mosto controller` (e.g. --ui-listen).
	Args []string
	// Coordinates registers each FEP with its city's coordinates
	// (cityCoords, by host name), for the dashboard's map; false: 0, 0.
	Coordinates bool
}

// controllerProc is the running controller of a Scenario.
type controllerProc struct {
	host   string
	dir    string
	url    string
	token  string
	client *api.Client
	proc   *proxyProc // the process (reuses the proxy process plumbing)
}

func (c ControllerConfig) withDefaults() ControllerConfig {
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = 2 * time.Second
	}
	if c.Debounce <= 0 {
		c.Debounce = 300 * time.Millisecond
	}
	if c.Converge <= 0 {
		c.Converge = 60 * time.Second
	}
	return c
}

// mosto runs the mosto binary outside the world (file-only subcommands).
func (s *Scenario) mosto(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.cfg.Mosto[0], append(append([]string(nil), s.cfg.Mosto[1:]...), args...)...)
	cmd.Env = append(os.Environ(), s.cfg.Env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("mosto %s: %v: %s", strings.Join(args, " "), err, tail(errb.String(), 400))
	}
	return out.String(), nil
}

// startController initializes the controller's data directory (CA, admin
// certificate, a reusable join token), starts `mosto controller` in its
// host's namespace and waits until its API answers.
func (s *Scenario) startController(ctx context.Context) error {
	cc := s.cfg.Controller.withDefaults()
	host := cc.Host
	if host == "" {
		host = s.roles.FEPs[0]
	}
	if !slices.Contains(s.w.Hosts(), host) {
		return fmt.Errorf("scenario: controller host %q is not in the world", host)
	}
	c := &controllerProc{host: host, dir: filepath.Join(s.dir, "controller")}
	ip := s.w.Addr(host).String()
	if _, err := s.mosto(ctx, "controller", "init", "--data", c.dir, "--hosts", ip); err != nil {
		return fmt.Errorf("scenario: %w", err)
	}
	tok, err := s.mosto(ctx, "token", "create", "--data", c.dir, "--reusable", "--ttl", "2h")
	if err != nil {
		return fmt.Errorf("scenario: %w", err)
	}
	c.token = strings.TrimSpace(tok)
	pdir := filepath.Join(c.dir, "pki")
	var pem [3][]byte
	for i, f := range []string{"ca.crt", "admin.crt", "admin.key"} {
		if pem[i], err = os.ReadFile(filepath.Join(pdir, f)); err != nil {
			return fmt.Errorf("scenario: controller admin credentials: %w", err)
		}
	}
	tcfg, err := pki.ClientTLSConfig(pem[0], pem[1], pem[2])
	if err != nil {
		return fmt.Errorf("scenario: controller admin credentials: %w", err)
	}
	addr := s.addr(host, controllerPort)
	c.url = "https://" + addr
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		return s.w.Dial(ctx, s.roles.Client, network, a)
	}
	c.client = &api.Client{BaseURL: c.url, HTTP: &http.Client{Transport: &http.Transport{
		DialContext: dial, TLSClientConfig: tcfg, ForceAttemptHTTP2: false, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}}}
	s.ctl = c
	if err := s.runController(); err != nil {
		return err
	}
	return s.waitAccept(ctx, s.roles.Client, addr)
}

// runController starts the controller process on the prepared directory.
func (s *Scenario) runController() error {
	c := s.ctl
	cc := s.cfg.Controller.withDefaults()
	sizes := make([]string, len(s.cfg.Sizes))
	for i, v := range s.cfg.Sizes {
		sizes[i] = strconv.FormatInt(v, 10)
	}
	n := strconv.Itoa(len(s.roles.FEPs))
	args := []string{"controller",
		"--data", c.dir, "--listen", s.addr(c.host, controllerPort), "--sizes", strings.Join(sizes, ","),
		"--debounce", cc.Debounce.String(), "--period", "1h", "--near", n, "--far", "0",
		"--allow-member-net", emu.Prefix.String()}
	m := s.PlanModel()
	if m.ICW > 0 {
		args = append(args, "--icw", strconv.Itoa(m.ICW))
	}
	if m.MSS > 0 {
		args = append(args, "--mss", strconv.Itoa(m.MSS))
	}
	if m.EndICW > 0 {
		args = append(args, "--end-icw", strconv.Itoa(m.EndICW), "--end-rtt", strconv.FormatFloat(m.EndRTT, 'f', -1, 64))
	}
	args = append(args, cc.Args...)
	p, err := s.spawn("controller", filepath.Join(s.dir, "controller.log"), c.host, args...)
	if err != nil {
		return err
	}
	c.proc = p
	return nil
}

// spawn starts `mosto args...` in host's namespace, logging to logf.
func (s *Scenario) spawn(name, logf, host string, args ...string) (*proxyProc, error) {
	p := &proxyProc{fep: name, done: make(chan struct{}), logf: logf}
	all := append(append([]string(nil), s.cfg.Mosto[1:]...), args...)
	p.cmd = s.w.Command(context.Background(), host, s.cfg.Mosto[0], all...)
	p.cmd.Env = append(os.Environ(), s.cfg.Env...)
	lf, err := os.OpenFile(logf, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("scenario: start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// stop ends p (SIGTERM, SIGKILL after 5 s; kill: SIGKILL at once).
func (p *proxyProc) stop(kill bool) {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	syscall.Kill(-p.cmd.Process.Pid, sig)
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// controllerSection is the `controller:` section of a proxy's config.
func (s *Scenario) controllerSection(fep string) map[string]any {
	cc := s.cfg.Controller.withDefaults()
	sec := map[string]any{
		"url":            s.ctl.url,
		"token":          s.ctl.token,
		"data_dir":       s.agentDir(fep),
		"probe_addr":     s.addr(fep, probePort),
		"probe_interval": cc.ProbeInterval.String(),
		"location":       fep,
	}
	if ll, ok := cityCoords[fep]; ok && cc.Coordinates {
		sec["lat"], sec["lon"] = ll[0], ll[1]
	}
	return sec
}

func (s *Scenario) agentDir(fep string) string { return filepath.Join(s.dir, "agent-"+fep) }

// UsesController reports whether the proxies follow a controller.
func (s *Scenario) UsesController() bool { return s.ctl != nil }

// ControllerHost returns the host running the controller ("" without one).
func (s *Scenario) ControllerHost() string {
	if s.ctl == nil {
		return ""
	}
	return s.ctl.host
}

// API returns an admin client of the controller's API (nil without one).
func (s *Scenario) API() *api.Client {
	if s.ctl == nil {
		return nil
	}
	return s.ctl.client
}

// Convergence is what waiting for discovery found.
type Convergence struct {
	Took     time.Duration     // from the call until converged
	Versions map[string]uint64 // table version per LoP (every FEP is its own LoP)
	Matrix   api.Matrix
}

// ProxyTable returns the table a proxy's agent holds (its persisted
// table.json in the agent's data directory); nil: none yet.
func (s *Scenario) ProxyTable(fep string) (*api.Table, error) {
	b, err := os.ReadFile(filepath.Join(s.agentDir(fep), "table.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var t api.Table
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("scenario: table of %s: %w", fep, err)
	}
	return &t, nil
}

// ProxyTableInstalled returns the version of the table a proxy's agent
// holds and when it installed it (the agent writes table.json before it
// swaps the table in); version 0: none yet.
func (s *Scenario) ProxyTableInstalled(fep string) (uint64, time.Time, error) {
	fi, err := os.Stat(filepath.Join(s.agentDir(fep), "table.json"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, err
	}
	v, err := s.ProxyTableVersion(fep)
	if err != nil {
		return 0, time.Time{}, err
	}
	// Read again: a table installed between the two reads has a newer
	// time; report the version with the time it was installed at the
	// latest.
	if fi2, err := os.Stat(filepath.Join(s.agentDir(fep), "table.json")); err == nil {
		fi = fi2
	}
	return v, fi.ModTime(), nil
}

// ProxyTableVersion returns the version of the table a proxy's agent holds
// (0: none yet).
func (s *Scenario) ProxyTableVersion(fep string) (uint64, error) {
	t, err := s.ProxyTable(fep)
	if t == nil || err != nil {
		return 0, err
	}
	return t.Version, nil
}

// WaitConverged waits until discovery converged: every FEP pair measured in
// at least one direction, a table for every FEP, every proxy holding the
// controller's current version of its table, and no version change for
// stable. It then loads the InP's table as the scenario's table.
func (s *Scenario) WaitConverged(ctx context.Context, stable time.Duration) (Convergence, error) {
	if s.ctl == nil {
		return Convergence{}, errors.New("scenario: no controller")
	}
	start := time.Now()
	deadline := start.Add(s.cfg.Controller.withDefaults().Converge)
	var last map[string]uint64
	var since time.Time
	why := "not polled"
	for {
		cv, reason, err := s.poll(ctx)
		switch {
		case err != nil:
			why = err.Error()
			last = nil
		case reason != "":
			why = reason
			last = nil
		case last == nil || !maps.Equal(last, cv.Versions):
			last, since, why = cv.Versions, time.Now(), "versions changing"
		case time.Since(since) >= stable:
			cv.Took = time.Since(start)
			if err := s.loadControllerTable(ctx); err != nil {
				return cv, err
			}
			return cv, nil
		}
		if err := s.exited(); err != nil {
			return Convergence{}, err
		}
		if time.Now().After(deadline) {
			return Convergence{}, fmt.Errorf("scenario: discovery did not converge within %v: %s\n%s%s", s.cfg.Controller.withDefaults().Converge, why, s.controllerCounters(ctx), s.logDigest(4))
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return Convergence{}, err
		}
	}
}

// poll reads the controller's matrix and tables and the proxies' versions;
// reason says what is missing.
func (s *Scenario) poll(ctx context.Context) (Convergence, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := s.ctl.client.Matrix(ctx)
	if err != nil {
		return Convergence{}, "", fmt.Errorf("matrix: %w", err)
	}
	idx := make(map[string]int)
	for i, n := range m.Names {
		idx[n] = i
	}
	var missing []string
	for _, a := range s.roles.FEPs {
		if _, ok := idx[a]; !ok {
			return Convergence{}, fmt.Sprintf("FEP %s not registered", a), nil
		}
	}
	for _, a := range s.roles.FEPs {
		for _, b := range s.roles.FEPs {
			if a >= b {
				continue
			}
			i, j := idx[a], idx[b]
			if m.RTTMS[i][j] == nil && m.RTTMS[j][i] == nil {
				missing = append(missing, a+"-"+b)
			}
		}
	}
	if len(missing) > 0 {
		// All of them: the first alone does not tell one silent FEP
		// (every pair of it missing) from a few slow pairs.
		return Convergence{}, fmt.Sprintf("%d pairs not measured: %s", len(missing), strings.Join(missing, " ")), nil
	}
	cv := Convergence{Versions: make(map[string]uint64), Matrix: m}
	for _, f := range s.roles.FEPs {
		t, err := s.ctl.client.Table(ctx, f, 0, 0)
		if err != nil {
			return Convergence{}, "", fmt.Errorf("table of %s: %w", f, err)
		}
		if t == nil {
			return Convergence{}, "no table for " + f, nil
		}
		pv, err := s.ProxyTableVersion(f)
		if err != nil {
			return Convergence{}, "", err
		}
		if pv != t.Version {
			return Convergence{}, fmt.Sprintf("proxy %s holds version %d, controller %d", f, pv, t.Version), nil
		}
		cv.Versions[f] = t.Version
	}
	return cv, "", nil
}

// loadControllerTable makes the InP's table (from the controller's API)
// the scenario's table.
func (s *Scenario) loadControllerTable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t, err := s.ctl.client.Table(ctx, s.roles.InP, 0, 0)
	if err != nil {
		return fmt.Errorf("scenario: table of %s: %w", s.roles.InP, err)
	}
	if t == nil {
		return fmt.Errorf("scenario: controller has no table for %s", s.roles.InP)
	}
	tf := t.Table
	tf.Version = t.Version
	ix, err := pathcomp.NewIndex(&tf)
	if err != nil {
		return fmt.Errorf("scenario: controller table of %s: %w", s.roles.InP, err)
	}
	s.table, s.index = &tf, ix
	return nil
}

// TableVersion returns the version of the table ComputedChain reads (the
// static table's, or the InP's table from the controller).
func (s *Scenario) TableVersion() uint64 {
	if s.table == nil {
		return 0
	}
	return s.table.Version
}

// ReloadTable reads the InP's current table from the controller again.
func (s *Scenario) ReloadTable(ctx context.Context) error {
	if s.ctl == nil {
		return errors.New("scenario: no controller")
	}
	return s.loadControllerTable(ctx)
}

// KillController ends the controller process with SIGKILL.
func (s *Scenario) KillController() error {
	if s.ctl == nil || s.ctl.proc == nil {
		return errors.New("scenario: no controller running")
	}
	s.ctl.proc.stop(true)
	s.ctl.proc = nil
	return nil
}

// RestartController starts the controller again on its data directory.
func (s *Scenario) RestartController(ctx context.Context) error {
	if s.ctl == nil || s.ctl.proc != nil {
		return errors.New("scenario: no stopped controller")
	}
	if err := s.runController(); err != nil {
		return err
	}
	return s.waitAccept(ctx, s.roles.Client, s.addr(s.ctl.host, controllerPort))
}

// RestartProxy stops the proxy of fep (SIGTERM) and starts it again with the
// same configuration, then waits until its metrics listener answers.
func (s *Scenario) RestartProxy(ctx context.Context, fep string) error {
	i := slices.IndexFunc(s.proxies, func(p *proxyProc) bool { return p.fep == fep })
	if i < 0 {
		return fmt.Errorf("scenario: no proxy %q", fep)
	}
	s.proxies[i].stop(false)
	p, err := s.spawn(fep, s.proxies[i].logf, fep, "proxy", "--config", filepath.Join(s.dir, "proxy-"+fep+".yaml"))
	if err != nil {
		return err
	}
	s.proxies[i] = p
	return s.waitAccept(ctx, s.roles.Client, s.addr(fep, metricsPort))
}

// exited returns an error naming the first proxy (or the controller) that
// exited, with the end of its log.
func (s *Scenario) exited() error {
	procs := slices.Clone(s.proxies)
	if s.ctl != nil && s.ctl.proc != nil {
		procs = append(procs, s.ctl.proc)
	}
	for _, p := range procs {
		select {
		case <-p.done:
			what := "proxy " + p.fep
			if s.ctl != nil && p == s.ctl.proc {
				what = "controller"
			}
			log, _ := os.ReadFile(p.logf)
			return fmt.Errorf("scenario: %s exited (%v): %s", what, p.err, tail(string(log), 600))
		default:
		}
	}
	return nil
}

// controllerCounters returns the controller's report counters (reports
// and samples stored, refusals by reason, each FEP's last report), for a
// post-mortem: refused samples are counted, not logged.
func (s *Scenario) controllerCounters(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.ctl.url+api.PathMetrics, nil)
	if err != nil {
		return fmt.Sprintf("controller metrics: %v\n", err)
	}
	resp, err := s.ctl.client.HTTP.Do(req)
	if err != nil {
		return fmt.Sprintf("controller metrics: %v\n", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Sprintf("controller metrics: %v\n", err)
	}
	var b strings.Builder
	b.WriteString("controller counters:")
	for _, l := range strings.Split(string(body), "\n") {
		for _, m := range []string{"mosto_controller_reports_total", "mosto_controller_samples_total", "mosto_controller_refused_total", "mosto_controller_feps ", "mosto_controller_fep_last_report_timestamp_seconds"} {
			if strings.HasPrefix(l, m) {
				b.WriteString(" " + strings.TrimPrefix(l, "mosto_controller_") + ";")
			}
		}
	}
	return b.String() + "\n"
}

// stateMsgs are the log messages of a proxy's agent whose last occurrence
// tells where its discovery stands.
var stateMsgs = []string{"msg=registered ", `msg="new table" `, `msg="probe targets" `}

// logDigest returns, for a post-mortem in a test's failure message, the
// last n warnings and errors of the controller's and every proxy's log
// (slog lines at WARN or ERROR, Go's own log lines such as TLS handshake
// errors, panics), with how many there were in all, and the last of each
// of the agent's state lines (stateMsgs).
func (s *Scenario) logDigest(n int) string {
	type src struct{ name, path string }
	var srcs []src
	if s.ctl != nil {
		srcs = append(srcs, src{"controller", filepath.Join(s.dir, "controller.log")})
	}
	for _, p := range s.proxies {
		srcs = append(srcs, src{"proxy " + p.fep, p.logf})
	}
	var b strings.Builder
	for _, f := range srcs {
		data, err := os.ReadFile(f.path)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", f.name, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		var bad []string
		state := make([]string, len(stateMsgs))
		for _, l := range lines {
			if l == "" {
				continue
			}
			for i, m := range stateMsgs {
				if strings.Contains(l, m) {
					state[i] = l
				}
			}
			if !strings.HasPrefix(l, "time=") || strings.Contains(l, " level=WARN ") || strings.Contains(l, " level=ERROR ") {
				bad = append(bad, l)
			}
		}
		fmt.Fprintf(&b, "%s: %d log lines, %d warnings/errors", f.name, len(lines), len(bad))
		if len(bad) > n {
			fmt.Fprintf(&b, ", the last %d", n)
			bad = bad[len(bad)-n:]
		}
		b.WriteString("\n")
		for _, l := range slices.Concat(state, bad) {
			if l == "" {
				continue
			}
			if len(l) > 400 {
				l = l[:400] + "..."
			}
			b.WriteString("    " + l + "\n")
		}
	}
	return b.String()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Converged returns what the wait for discovery found in Start.
func (s *Scenario) Converged() Convergence { return s.conv }

// JoinToken returns the controller's reusable join token ("" without a
// controller): what a token holder (a new FEP, or a rogue one) presents.
func (s *Scenario) JoinToken() string {
	if s.ctl == nil {
		return ""
	}
	return s.ctl.token
}

// ControllerURL returns the controller's API URL ("" without one).
func (s *Scenario) ControllerURL() string {
	if s.ctl == nil {
		return ""
	}
	return s.ctl.url
}

// AgentDir returns the data directory of fep's agent (its key, certificate
// and the CA's certificate: fep.key, fep.crt, ca.crt).
func (s *Scenario) AgentDir(fep string) string { return s.agentDir(fep) }

// MetricsAddr returns the address of fep's metrics listener.
func (s *Scenario) MetricsAddr(fep string) string { return s.addr(fep, metricsPort) }
