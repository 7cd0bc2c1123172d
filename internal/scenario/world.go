package scenario

import (
	_ "embed"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
)

//go:embed demo.yaml
var demoYAML []byte

// DemoSpec returns the demo world: a client and an nginx front-end near
// Dublin, an origin in San Francisco and eight FEPs between them, on the
// embedded WonderProxy RTT data.
func DemoSpec() (*emu.Spec, error) { return emu.ParseSpec(demoYAML) }

// DemoYAML returns the demo world's spec file.
func DemoYAML() []byte { return slices.Clone(demoYAML) }

// Roles names the hosts of a world by what they do. FEPs are every host but
// the client and the origin unless FEPs is set.
type Roles struct {
	Client string   // host that fetches (and runs the CDN front-end)
	Origin string   // host of the origin server
	FEPs   []string // hosts that run a proxy; their names are the FEP ids
	InP    string   // FEP the client enters mosto at: default the FEP nearest the client
	EgP    string   // FEP next to the origin: default the FEP nearest the origin
	Single string   // FEP of the single-proxy mode: default the one minimizing the longer of its two legs
}

// rtt is the configured RTT between two hosts.
type rtt func(a, b string) time.Duration

// resolve fills the defaults of r for the hosts and RTTs of a world.
func (r Roles) resolve(hosts []string, d rtt) (Roles, error) {
	if r.Client == "" {
		r.Client = "client"
	}
	if r.Origin == "" {
		r.Origin = "origin"
	}
	has := func(h string) bool { return slices.Contains(hosts, h) }
	for _, h := range []string{r.Client, r.Origin} {
		if !has(h) {
			return r, fmt.Errorf("scenario: world has no host %q (hosts: %v)", h, hosts)
		}
	}
	if r.Client == r.Origin {
		return r, fmt.Errorf("scenario: client and origin are the same host %q", r.Client)
	}
	if len(r.FEPs) == 0 {
		for _, h := range hosts {
			if h != r.Client && h != r.Origin {
				r.FEPs = append(r.FEPs, h)
			}
		}
	}
	if len(r.FEPs) == 0 {
		return r, fmt.Errorf("scenario: world has no FEP hosts besides %q and %q", r.Client, r.Origin)
	}
	for _, f := range r.FEPs {
		if !has(f) || f == r.Client || f == r.Origin {
			return r, fmt.Errorf("scenario: FEP %q is not a host of the world other than client and origin", f)
		}
	}
	nearest := func(to string) string {
		best, bd := "", time.Duration(math.MaxInt64)
		for _, f := range r.FEPs {
			if v := d(f, to); v < bd {
				best, bd = f, v
			}
		}
		return best
	}
	if r.InP == "" {
		r.InP = nearest(r.Client)
	}
	if r.EgP == "" {
		r.EgP = nearest(r.Origin)
	}
	if r.Single == "" {
		bd := time.Duration(math.MaxInt64)
		for _, f := range r.FEPs {
			if v := max(d(r.Client, f), d(f, r.Origin)); v < bd {
				r.Single, bd = f, v
			}
		}
	}
	for _, f := range []string{r.InP, r.EgP, r.Single} {
		if !slices.Contains(r.FEPs, f) {
			return r, fmt.Errorf("scenario: %q is not a FEP (FEPs: %v)", f, r.FEPs)
		}
	}
	if r.InP == r.EgP {
		return r, fmt.Errorf("scenario: ingress and egress FEP are both %q: no chain to build", r.InP)
	}
	return r, nil
}
