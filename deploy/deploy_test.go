package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/cli"
	"github.com/mosto-net/mosto/internal/metrics"
)

// exportedMetrics returns every metric name mosto exports: the mosto_*
// metrics declared in the code (histograms with their _bucket, _sum and
// _count series) and the Go and process series, gathered from a real
// registry.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	decl := regexp.MustCompile(`Name:\s*"(mosto_[a-z0-9_]+)"`)
	err := filepath.WalkDir("../internal", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatchIndex(b, -1) {
			n := string(b[m[2]:m[3]])
			names[n] = true
			if bytes.Contains(b[max(0, m[0]-200):m[0]], []byte("HistogramVec(metrics.Opts")) {
				names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := metrics.NewRegistry()
	reg.RegisterRuntime()
	for _, mf := range reg.Gather() {
		names[mf.Name] = true
	}
	if !names["process_resident_memory_bytes"] || !names["go_goroutines"] {
		t.Fatalf("the runtime series lack process_resident_memory_bytes or go_goroutines: %v", names)
	}
	names["up"] = true // set by Prometheus for every target
	for _, want := range []string{"mosto_relay_flows_total", "mosto_relay_direct_total", "mosto_controller_leader", "mosto_relay_connect_seconds_bucket"} {
		if !names[want] {
			t.Fatalf("the metric scan missed %s: fix exportedMetrics", want)
		}
	}
	return names
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promLabels   = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promNumbers  = regexp.MustCompile(`\b\d+(\.\d+)?([eE][+-]?\d+)?\b`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression selects.
func metricNames(expr string) []string {
	s := promStrings.ReplaceAllString(expr, " ")
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRanges.ReplaceAllString(s, " ")
	s = promLabels.ReplaceAllString(s, " ")
	s = promNumbers.ReplaceAllString(s, " ")
	var out []string
	for _, m := range promIdent.FindAllStringIndex(s, -1) {
		id := s[m[0]:m[1]]
		rest := strings.TrimLeft(s[m[1]:], " \t\n")
		if promKeywords[strings.ToLower(id)] || strings.HasPrefix(rest, "(") {
			continue // an operator, or a function or aggregation
		}
		out = append(out, id)
	}
	return out
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (fep) (rate(mosto_relay_flows_total{role="inp"}[5m]))`, []string{"mosto_relay_flows_total"}},
		{`a:b:rate5m / clamp_min(c_total, 1e-9) > 0.2 and on (x) d`, []string{"a:b:rate5m", "c_total", "d"}},
		{`histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))`, []string{"x_bucket"}},
		{`time() - max(k) > 26 * 3600`, []string{"k"}},
		{`up{job="mosto-proxy", x=~"a(b)"} == 0`, []string{"up"}},
	}
	for _, tc := range tests {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q; want %q", tc.expr, got, tc.want)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// checkQuery reports the names expr selects that are neither exported nor
// recorded.
func checkQuery(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	names := metricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s: query %q names no metric", where, expr)
	}
	for _, n := range names {
		if !known[n] {
			t.Errorf("%s: query %q names %s, which mosto does not export (nor a recording rule)", where, expr, n)
		}
	}
}

// TestPrometheusBundle: the scrape config and rules parse, every query
// names an exported or recorded metric, and the alerts exist.
func TestPrometheusBundle(t *testing.T) {
	known := exportedMetrics(t)
	var rf ruleFile
	readYAML(t, "prometheus/rules.yml", &rf)
	var alerts []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			name := r.Record + r.Alert
			if (r.Record == "") == (r.Alert == "") || r.Expr == "" {
				t.Errorf("rule %q: want exactly one of record and alert, and an expr", name)
			}
			checkQuery(t, "rules.yml "+name, r.Expr, known)
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
				if r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
					t.Errorf("alert %s: want a summary annotation and a severity label", r.Alert)
				}
			}
		}
	}
	for _, want := range []string{"MostoFEPDown", "MostoMatrixStale", "MostoFallbackRatioHigh", "MostoKeyRotationOverdue", "MostoNoLeader"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("rules.yml has no alert %s", want)
		}
	}
	// A misspelt metric is caught.
	if n := metricNames(`rate(mosto_relay_flowz_total[5m])`); known[n[0]] {
		t.Errorf("mosto_relay_flowz_total counted as exported")
	}

	var pc struct {
		Global        map[string]any `yaml:"global"`
		RuleFiles     []string       `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string         `yaml:"job_name"`
			Scheme        string         `yaml:"scheme"`
			TLSConfig     map[string]any `yaml:"tls_config"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
			RelabelConfigs []map[string]any `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &pc)
	if !slices.Contains(pc.RuleFiles, "rules.yml") {
		t.Errorf("prometheus.yml rule_files %v: want rules.yml", pc.RuleFiles)
	}
	jobs := map[string]bool{}
	for _, sc := range pc.ScrapeConfigs {
		jobs[sc.JobName] = true
		if sc.JobName == "mosto-controller" && (sc.Scheme != "https" || sc.TLSConfig["cert_file"] == nil) {
			t.Errorf("mosto-controller job: the controller's /metrics is behind mTLS: want https and a client certificate")
		}
	}
	for _, j := range []string{"mosto-controller", "mosto-proxy"} {
		if !jobs[j] {
			t.Errorf("prometheus.yml has no job %s", j)
		}
	}
	// The rules select job="mosto-proxy": the job must exist (checked above).
}

// TestGrafanaDashboard: the dashboard JSON parses and every query names an
// exported or recorded metric.
func TestGrafanaDashboard(t *testing.T) {
	known := exportedMetrics(t)
	var rf ruleFile
	readYAML(t, "prometheus/rules.yml", &rf)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	b, err := os.ReadFile("grafana/mosto.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/mosto.json: %v", err)
	}
	if d.UID == "" || len(d.Panels) < 10 {
		t.Fatalf("grafana/mosto.json: uid %q, %d panels", d.UID, len(d.Panels))
	}
	n := 0
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkQuery(t, "panel "+p.Title, tg.Expr, known)
			n++
		}
	}
	t.Logf("%d panels, %d queries checked against %d exported or recorded names", len(d.Panels), n, len(known))
}

// flagsOf returns the flags `mosto CMD -h` lists.
func flagsOf(t *testing.T, cmd string) map[string]bool {
	t.Helper()
	var out, errb bytes.Buffer
	cli.Run(context.Background(), []string{cmd, "-h"}, strings.NewReader(""), &out, &errb)
	flags := map[string]bool{}
	re := regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`)
	for _, m := range re.FindAllStringSubmatch(errb.String()+out.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("mosto %s -h listed no flags:\n%s", cmd, errb.String())
	}
	return flags
}

// checkArgs checks that args (after the subcommand) are flags of cmd.
func checkArgs(t *testing.T, where, cmd string, args []string) {
	t.Helper()
	flags := flagsOf(t, cmd)
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue // a value, or an environment variable of the unit
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !flags[name] {
			t.Errorf("%s: mosto %s has no flag --%s", where, cmd, name)
		}
	}
}

// unit is a parsed systemd unit: section -> key -> values.
type unit map[string]map[string][]string

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	sec := ""
	sc := bufio.NewScanner(f)
	for ln := 1; sc.Scan(); ln++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			sec = line[1 : len(line)-1]
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("%s:%d: not KEY=VALUE in a section: %q", path, ln, line)
			}
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

func (u unit) get(sec, key string) string {
	if v := u[sec][key]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// TestSystemdUnits: the units parse, run existing subcommands with
// existing flags, are hardened, and the socket unit names its service.
func TestSystemdUnits(t *testing.T) {
	for _, name := range []string{"mosto-controller.service", "mosto-proxy@.service"} {
		u := readUnit(t, "systemd/"+name)
		exec := strings.Fields(u.get("Service", "ExecStart"))
		if len(exec) < 2 || exec[0] != "/usr/local/bin/mosto" {
			t.Fatalf("%s: ExecStart %q: want /usr/local/bin/mosto CMD ...", name, exec)
		}
		checkArgs(t, name, exec[1], exec[2:])
		for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
			"PrivateTmp": "yes", "RestrictNamespaces": "yes", "ProtectKernelTunables": "yes"} {
			if got := u.get("Service", k); got != want {
				t.Errorf("%s: %s=%q; want %q", name, k, got, want)
			}
		}
		if _, ok := u["Service"]["CapabilityBoundingSet"]; !ok {
			t.Errorf("%s: no CapabilityBoundingSet", name)
		}
		if u.get("Service", "DynamicUser") != "yes" && u.get("Service", "User") == "" {
			t.Errorf("%s: runs as root (no DynamicUser=yes, no User=)", name)
		}
		if u.get("Install", "WantedBy") == "" {
			t.Errorf("%s: no [Install] WantedBy", name)
		}
	}
	s := readUnit(t, "systemd/mosto-proxy@.socket")
	if s.get("Socket", "ListenStream") == "" || s.get("Socket", "FileDescriptorName") == "" {
		t.Errorf("mosto-proxy@.socket: want ListenStream and FileDescriptorName")
	}
	// FileDescriptorName= names every socket of a unit (the last one wins):
	// one line, a name the proxy matches its stream socket to, and the
	// datagram socket is taken by its type.
	if n := len(s["Socket"]["FileDescriptorName"]); n != 1 || s.get("Socket", "FileDescriptorName") != "hop" {
		t.Errorf("mosto-proxy@.socket: FileDescriptorName %q; want one line, hop (it names every socket of the unit)", s["Socket"]["FileDescriptorName"])
	}
	if s.get("Socket", "ListenDatagram") == "" {
		t.Errorf("mosto-proxy@.socket: no ListenDatagram (the measurement endpoint)")
	}
	if got := s.get("Socket", "Service"); got != "mosto-proxy@%i.service" {
		t.Errorf("mosto-proxy@.socket: Service=%q; want mosto-proxy@%%i.service", got)
	}
	if s.get("Install", "WantedBy") != "sockets.target" {
		t.Errorf("mosto-proxy@.socket: WantedBy=%q; want sockets.target", s.get("Install", "WantedBy"))
	}
	// systemd's own check, when installed: copies of the units (instance
	// fra) whose ExecStart runs an executable that exists.
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: units not verified by systemd")
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var files []string
	for from, to := range map[string]string{"mosto-controller.service": "mosto-controller.service",
		"mosto-proxy@.service": "mosto-proxy@fra.service", "mosto-proxy@.socket": "mosto-proxy@fra.socket"} {
		b, err := os.ReadFile("systemd/" + from)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/mosto"), []byte(exe))
		if err := os.WriteFile(filepath.Join(dir, to), b, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.Join(dir, to))
	}
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, files...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// k8sDocs reads every document of a manifest file.
func k8sDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d == nil {
			continue
		}
		for _, k := range []string{"apiVersion", "kind", "metadata"} {
			if d[k] == nil {
				t.Errorf("%s: a document without %s", path, k)
			}
		}
		out = append(out, d)
	}
	return out
}

// dig follows keys (strings for maps, ints for lists) into v.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestKubernetesManifests: the kustomization's resources parse; the
// controller StatefulSet runs `mosto controller` on etcd with existing
// flags; the proxy DaemonSet is on the host network, drops every
// capability but NET_BIND_SERVICE, and ships a proxy configuration that
// mosto loads, whose ports are the container's; kubectl renders it when
// installed.
func TestKubernetesManifests(t *testing.T) {
	var kz struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Namespace  string `yaml:"namespace"`
		Images     []map[string]string
		Resources  []string `yaml:"resources"`
	}
	readYAML(t, "kubernetes/kustomization.yaml", &kz)
	kinds := map[string]map[string]any{}
	for _, r := range kz.Resources {
		for _, d := range k8sDocs(t, filepath.Join("kubernetes", r)) {
			kinds[d["kind"].(string)+"/"+dig(d, "metadata", "name").(string)] = d
		}
	}
	for _, want := range []string{"StatefulSet/etcd", "StatefulSet/mosto-controller", "DaemonSet/mosto-proxy", "ConfigMap/mosto-proxy", "Service/mosto-controller", "Namespace/mosto"} {
		if kinds[want] == nil {
			t.Errorf("no %s in the kustomization", want)
		}
	}
	ctl := kinds["StatefulSet/mosto-controller"]
	c0 := dig(ctl, "spec", "template", "spec", "containers", 0)
	args := strs(dig(c0, "args"))
	if args[0] != "controller" {
		t.Fatalf("controller container args %q: want controller ...", args)
	}
	checkArgs(t, "controller StatefulSet", "controller", args[1:])
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--etcd=") }) {
		t.Errorf("controller StatefulSet: no --etcd: two replicas on bbolt would not share state")
	}
	if dig(ctl, "spec", "volumeClaimTemplates", 0) == nil {
		t.Errorf("controller StatefulSet: no volumeClaimTemplates")
	}

	ds := kinds["DaemonSet/mosto-proxy"]
	pod := dig(ds, "spec", "template", "spec")
	if dig(pod, "hostNetwork") != true {
		t.Errorf("proxy DaemonSet: hostNetwork %v; want true", dig(pod, "hostNetwork"))
	}
	p0 := dig(pod, "containers", 0)
	pargs := strs(dig(p0, "args"))
	if pargs[0] != "proxy" {
		t.Fatalf("proxy container args %q", pargs)
	}
	checkArgs(t, "proxy DaemonSet", "proxy", pargs[1:])
	caps := dig(p0, "securityContext", "capabilities")
	if d := dig(caps, "drop"); d == nil || !slices.Contains(strs(d), "ALL") {
		t.Errorf("proxy container: capabilities.drop %v; want ALL", d)
	}
	if a := dig(caps, "add"); a == nil || !slices.Equal(strs(a), []string{"NET_BIND_SERVICE"}) {
		t.Errorf("proxy container: capabilities.add %v; want [NET_BIND_SERVICE]", a)
	}
	ports := map[string]int{}
	for _, p := range dig(p0, "ports").([]any) {
		ports[dig(p, "name").(string)] = dig(p, "containerPort").(int)
	}
	// The shipped proxy configuration, as the init container fills it in.
	cfgText := dig(kinds["ConfigMap/mosto-proxy"], "data", "proxy.yaml").(string)
	cfgText = strings.NewReplacer("FEP_ID", "node-a", "NODE_IP", "192.0.2.10").Replace(cfgText)
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := cli.LoadProxyFile(path)
	if err != nil {
		t.Fatalf("the DaemonSet's proxy.yaml does not load: %v", err)
	}
	if cfg.Controller == nil || cfg.ID != "node-a" {
		t.Fatalf("proxy.yaml: id %q, controller %v", cfg.ID, cfg.Controller)
	}
	portOf := func(hp string) int {
		i := strings.LastIndex(hp, ":")
		n, _ := strconv.Atoi(hp[i+1:])
		return n
	}
	for name, addr := range map[string]string{"hop": cfg.Hop.Listen, "metrics": cfg.Metrics.Listen, "probe": cfg.Controller.ProbeAddr} {
		if ports[name] == 0 || ports[name] != portOf(addr) {
			t.Errorf("proxy port %s: container port %d, configuration %s", name, ports[name], addr)
		}
	}
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.Command(kubectl, "kustomize", "kubernetes").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl kustomize: %v\n%s", err, out)
		}
		if !bytes.Contains(out, []byte("image: ghcr.io/mosto-net/mosto:latest")) || !bytes.Contains(out, []byte("namespace: mosto")) {
			t.Errorf("kubectl kustomize: images or namespace not applied:\n%.2000s", out)
		}
		t.Logf("kubectl kustomize rendered %d bytes", len(out))
	} else {
		t.Log("kubectl not installed: rendering not checked")
	}
}

// TestContainerfile: a static build on an empty base, running unprivileged.
func TestContainerfile(t *testing.T) {
	b, err := os.ReadFile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"CGO_ENABLED=0", "FROM scratch", "USER 65532", "./cmd/mosto", `ENTRYPOINT ["/usr/local/bin/mosto"]`} {
		if !strings.Contains(s, want) {
			t.Errorf("Containerfile lacks %q", want)
		}
	}
}
