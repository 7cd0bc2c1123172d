package emu

import (
	"math"
	"strings"
	"testing"
)

func TestParseSpecErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"empty", ``, "empty spec"},
		{"no hosts", `name: x`, "no hosts"},
		{"unknown field", "hosts: [{name: a}]\nbogus: 1", "bogus"},
		{"unknown host in link", "hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: c, delay_ms: 1}]", `unknown host "c"`},
		{"negative delay", "hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: -5}]", "delay_ms is -5"},
		{"loss over 100", "hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 5, loss_pct: 101}]", "loss_pct is 101"},
		{"negative loss host", "hosts: [{name: a, loss_pct: -1}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 5}]", "loss_pct is -1"},
		{"address clash", "hosts: [{name: a, addr: 10.77.0.9}, {name: b, addr: 10.77.0.9}]\nlinks: [{a: a, b: b, delay_ms: 5}]", "address clash"},
		{"address outside", "hosts: [{name: a, addr: 192.168.1.1}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 5}]", "not a host address"},
		{"duplicate host", "hosts: [{name: a}, {name: a}]", `duplicate host "a"`},
		{"bad host name", "hosts: [{name: 'a b'}]", "bad name"},
		{"missing delay", "hosts: [{name: a}, {name: b}, {name: c}]\nlinks: [{a: a, b: b, delay_ms: 5}]", "no delay for pair a-c"},
		{"self link", "hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: a, delay_ms: 5}]", "itself"},
		{"pair twice", "hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 5}, {a: b, b: a, delay_ms: 6}]", "given twice"},
		{"location without dataset", "hosts: [{name: a, location: Dublin}]", "needs a dataset"},
		{"unknown location", "dataset: wonderproxy\nhosts: [{name: a, location: Atlantis}, {name: b, location: Dublin}]", `unknown location "Atlantis"`},
		{"unknown dataset", "dataset: nope\nhosts: [{name: a}]", "unknown dataset"},
		{"both datasets", "dataset: wonderproxy\nrtt_csv: x.csv\nhosts: [{name: a}]", "not both"},
		{"default delay", "defaults: {delay_ms: 3}\nhosts: [{name: a}]", "defaults: delay_ms"},
		{"bad cc", "tcp: {congestion: 'cu bic'}\nhosts: [{name: a}]", "congestion"},
		{"bad ssai", "tcp: {slow_start_after_idle: 2}\nhosts: [{name: a}]", "slow_start_after_idle"},
		{"small rmem", "tcp: {rmem_max: 100}\nhosts: [{name: a}]", "rmem_max"},
		{"negative queue", "hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 5, queue_pkts: -1}]", "queue_pkts"},
		{"two documents", "hosts: [{name: a}]\n---\nhosts: [{name: b}]", "more than one"},
		{"not yaml", "hosts: [", "parse spec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("ParseSpec(%q) = nil error; want one containing %q", tt.yaml, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseSpec(%q) error = %q; want it to contain %q", tt.yaml, err, tt.want)
			}
		})
	}
}

func TestParseSpecResolve(t *testing.T) {
	s, err := ParseSpec([]byte(`
name: demo
dataset: wonderproxy
hosts:
  - {name: client, location: Dublin, loss_pct: 1}
  - {name: fep-lon, location: London}
  - {name: origin, location: "San Francisco", addr: 10.77.0.1}
  - {name: extra}
links:
  - {a: client, b: extra, delay_ms: 5, loss_pct: 0.5, jitter_ms: 1, jitter_gso: true, rate_mbit: 100, queue_ms: 50}
  - {a: fep-lon, b: extra, delay_ms: 7}
  - {a: origin, b: extra, delay_ms: 70}
  - {a: client, b: origin, rate_mbit: 50}
defaults: {rate_mbit: 0, loss_pct: 0}
tcp: {rmem_max: 67108864, wmem_max: 67108864, congestion: cubic, slow_start_after_idle: 0, initcwnd: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.resolve()
	if err != nil {
		t.Fatal(err)
	}
	// origin has the fixed address, the others are numbered around it.
	wantAddrs := []string{"10.77.0.2", "10.77.0.3", "10.77.0.1", "10.77.0.4"}
	for i, w := range wantAddrs {
		if p.addrs[i].String() != w {
			t.Errorf("addr of %s = %v; want %s", p.names[i], p.addrs[i], w)
		}
	}
	// Dublin-London is a short path (RTT a few ms to ~20 ms), SF much longer.
	if d := p.links[0][1].DelayMS; d <= 1 || d > 20 {
		t.Errorf("Dublin->London one-way = %v ms; want 1..20", d)
	}
	if d := p.links[0][2].DelayMS; d < 50 || d > 150 {
		t.Errorf("Dublin->SF one-way = %v ms; want 50..150", d)
	}
	if p.links[0][2].DelayMS != p.links[2][0].DelayMS {
		t.Errorf("matrix delays not symmetric: %v vs %v", p.links[0][2].DelayMS, p.links[2][0].DelayMS)
	}
	ce := p.links[0][3]
	if ce.DelayMS != 5 || ce.LossPct != 0.5 || ce.RateMbit != 100 || ce.QueueMS != 50 || ce.JitterMS != 1 || !ce.JitterGSO {
		t.Errorf("client->extra = %+v; want the explicit link", ce)
	}
	if p.links[1][3].JitterGSO {
		t.Errorf("fep-lon->extra has jitter_gso; want the default (per segment)")
	}
	// client's host loss applies to its other pairs, both directions.
	if l := p.links[1][0].LossPct; math.Abs(l-1) > 1e-9 {
		t.Errorf("fep-lon->client loss = %v; want 1 (host setting)", l)
	}
	if l := p.links[1][2].LossPct; l != 0 {
		t.Errorf("fep-lon->origin loss = %v; want 0", l)
	}
	// A partial override keeps the matrix delay.
	if co := p.links[0][2]; co.RateMbit != 50 || co.DelayMS < 50 {
		t.Errorf("client->origin = %+v; want matrix delay and rate 50", co)
	}
}

func TestCombine(t *testing.T) {
	got := combine(Link{LossPct: 10, RateMbit: 100, JitterMS: 1}, Link{LossPct: 10, RateMbit: 50, JitterMS: 3})
	if math.Abs(got.LossPct-19) > 1e-9 || got.RateMbit != 50 || got.JitterMS != 3 {
		t.Errorf("combine = %+v; want loss 19, rate 50, jitter 3", got)
	}
	if got := combine(Link{RateMbit: 0}, Link{RateMbit: 20}); got.RateMbit != 20 {
		t.Errorf("combine rate(0, 20) = %v; want 20 (0 = unlimited)", got.RateMbit)
	}
}

func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 5}]",
		"dataset: default\nhosts: [{name: a, location: Dublin}, {name: b, location: London}]",
		"hosts: [{name: a, addr: 10.77.0.9, loss_pct: 3}, {name: b, rate_mbit: 10}]\nlinks: [{a: a, b: b, delay_ms: 5, queue_pkts: 10}]",
		"tcp: {congestion: cubic, initcwnd: 10}\nhosts: [{name: x}]",
		"hosts: [",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSpec(data)
		if err != nil {
			return
		}
		p, err := s.resolve()
		if err != nil {
			t.Fatalf("ParseSpec accepted a spec that does not resolve: %v", err)
		}
		seen := map[string]bool{}
		for i := range p.names {
			if !Prefix.Contains(p.addrs[i]) || seen[p.addrs[i].String()] {
				t.Fatalf("bad or duplicate address %v", p.addrs[i])
			}
			seen[p.addrs[i].String()] = true
			for j := range p.names {
				l := p.links[i][j]
				if i != j && (math.IsNaN(l.DelayMS) || l.DelayMS < 0 || l.LossPct < 0 || l.LossPct > 100) {
					t.Fatalf("bad link %d->%d: %+v", i, j, l)
				}
			}
		}
	})
}
