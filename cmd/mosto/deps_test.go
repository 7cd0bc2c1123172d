package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/mosto-net/mosto"

// goBin is the go command: from PATH, else the toolchain's.
func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// goList runs `go list -deps` on pkgs and returns every dependency with
// its imports.
func goList(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, pkgs...)
	out, err := exec.Command(goBin(), args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps[f[0]] = f[1:]
	}
	if len(deps) < 10 {
		t.Fatalf("go list found %d packages; the fence would check nothing", len(deps))
	}
	return deps
}

// importers names the packages of deps that import p.
func importers(deps map[string][]string, p string) []string {
	var out []string
	for q, imps := range deps {
		if slices.Contains(imps, p) {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return out
}

// TestBinaryDeps fences the mosto binary's dependencies (like tailscale's
// cmd/derper deptest): no gRPC and no etcd client or server (the etcd store
// speaks etcd's JSON gateway through internal/etcdhttp, docs/design.md),
// no test package (testing, httptest, or this module's *test and testenv
// helpers), and not the Prometheus client library or protobuf
// (internal/metrics instead): their package init cost ~1.8 ms at every
// start, which a socket-activated proxy pays on its first connection
// (docs/ops.md).
func TestBinaryDeps(t *testing.T) {
	deps := goList(t, module+"/cmd/mosto")
	if _, ok := deps[module+"/internal/relay"]; !ok {
		t.Fatal("the binary does not link internal/relay: go list answered something else")
	}
	for _, v := range binaryViolations(deps) {
		t.Error(v)
	}
}

// TestFenceCatches checks the fence against a package that breaks it: the
// in-process etcd server the etcd store's tests use.
func TestFenceCatches(t *testing.T) {
	deps := goList(t, module+"/internal/store/etcdstore/etcdtest")
	v := binaryViolations(deps)
	var grpc, etcd, helper, prom bool
	for _, s := range v {
		prom = prom || strings.Contains(s, "github.com/prometheus/client_golang/prometheus (start-up cost)")
		grpc = grpc || strings.Contains(s, "(gRPC)")
		etcd = etcd || strings.Contains(s, "(etcd client or server)")
		helper = helper || strings.Contains(s, "etcdtest (a test helper package)")
	}
	if !grpc || !etcd || !helper || !prom {
		t.Errorf("fence on etcdtest: gRPC %v, etcd %v, test helper %v, prometheus %v; want all caught (%d violations)", grpc, etcd, helper, prom, len(v))
	}
}

// binaryViolations lists what of deps may not be linked into the binary.
func binaryViolations(deps map[string][]string) []string {
	var out []string
	for p := range deps {
		var why string
		switch {
		case strings.HasPrefix(p, "google.golang.org/grpc"):
			why = "gRPC"
		case strings.HasPrefix(p, "go.etcd.io/etcd/client"), strings.HasPrefix(p, "go.etcd.io/etcd/server"),
			strings.HasPrefix(p, "go.etcd.io/etcd/api"):
			why = "etcd client or server"
		case strings.HasPrefix(p, "github.com/prometheus/"), strings.HasPrefix(p, "google.golang.org/protobuf"),
			p == "runtime/metrics", p == "expvar":
			why = "start-up cost"
		case p == "testing", strings.HasPrefix(p, "testing/"), p == "net/http/httptest":
			why = "a test package"
		case strings.HasPrefix(p, module+"/") && (strings.HasSuffix(p, "test") || strings.HasSuffix(p, "/testenv")):
			why = "a test helper package"
		}
		if why != "" {
			out = append(out, fmt.Sprintf("mosto links %s (%s), imported by %v", p, why, importers(deps, p)))
		}
	}
	slices.Sort(out)
	return out
}

// TestDataPlaneDeps checks that the data plane (relay, evloop, hop and what
// they import) imports nothing from the control plane: the proxy keeps
// relaying with the controller, its agent and its store gone.
func TestDataPlaneDeps(t *testing.T) {
	dataPlane := []string{"relay", "evloop", "hop"}
	controlPlane := []string{"agent", "controller", "api", "store", "etcdhttp", "cli", "dashboard"}
	var pkgs []string
	for _, p := range dataPlane {
		pkgs = append(pkgs, module+"/internal/"+p)
	}
	deps := goList(t, pkgs...)
	for p := range deps {
		for _, c := range controlPlane {
			if cp := module + "/internal/" + c; p == cp || strings.HasPrefix(p, cp+"/") {
				t.Errorf("the data plane (%v) imports control-plane package %s, via %v", dataPlane, p, importers(deps, p))
			}
		}
	}
}
