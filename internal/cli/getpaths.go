package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/pki"
)

// controllerPaths is `mosto get --controller`: the chains of each mirror
// from the controller's GET /v1/paths, one sub-flow per chain, each pinned
// to its chain through the local proxy's CONNECT entry (Mosto-Route).
type controllerPaths struct {
	base       string // the controller's API URL
	from       string // the InP: the FEP whose CONNECT entry is entry
	to         []string
	entry      string
	user, pass string
	k          int
	client     *http.Client
}

// fetch asks the controller for k chains from the InP to egp.
func (c *controllerPaths) fetch(ctx context.Context, egp string) (api.Paths, error) {
	q := url.Values{"from": {c.from}, "to": {egp}, "k": {strconv.Itoa(c.k)}, "size": {"0"}}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.base, "/")+api.PathPaths+"?"+q.Encode(), nil)
	if err != nil {
		return api.Paths{}, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return api.Paths{}, fmt.Errorf("controller: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return api.Paths{}, fmt.Errorf("controller: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return api.Paths{}, fmt.Errorf("controller: GET %s %s -> %s: %s", api.PathPaths, q.Encode(), resp.Status, strings.TrimSpace(string(b)))
	}
	var p api.Paths
	if err := json.Unmarshal(b, &p); err != nil {
		return api.Paths{}, fmt.Errorf("controller: %s: %w", api.PathPaths, err)
	}
	if len(p.Chains) == 0 {
		return api.Paths{}, fmt.Errorf("controller: no chain from %s to %s", c.from, egp)
	}
	for _, ch := range p.Chains {
		if len(ch.Path) == 0 || ch.Path[0] != c.from {
			return api.Paths{}, fmt.Errorf("controller: chain %v does not start at %s", ch.Path, c.from)
		}
	}
	return p, nil
}

// sources returns one sub-flow per (mirror, chain), coupled where chains
// share links.
func (c *controllerPaths) sources(ctx context.Context, urls []string) ([]mget.Source, error) {
	var chains [][]string
	var owner []string
	for i, u := range urls {
		egp := c.to[0]
		if len(c.to) > 1 {
			egp = c.to[i]
		}
		p, err := c.fetch(ctx, egp)
		if err != nil {
			return nil, err
		}
		for _, ch := range p.Chains {
			chains = append(chains, ch.Path)
			owner = append(owner, u)
		}
	}
	groups := coupleChains(chains)
	var srcs []mget.Source
	for i, ch := range chains {
		srcs = append(srcs, mget.Source{
			URL:   owner[i],
			Path:  "chain " + strings.Join(ch, ">"),
			Group: groups[i],
			Dial:  mget.ViaConnect(c.entry, ch, c.user, c.pass, nil),
		})
	}
	return srcs, nil
}

// coupleChains returns each chain's coupling group: chains that share a
// link (two FEPs next to each other, either direction), directly or
// through other chains, are in one group, named "g" and its first chain's
// index; a chain that shares no link has none (""). Shared links are
// computed over every mirror's chains: /v1/paths reports those of one
// (InP, EgP) pair.
func coupleChains(chains [][]string) []string {
	parent := make([]int, len(chains))
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	byLink := map[[2]string]int{}
	for i, ch := range chains {
		for k := 0; k+1 < len(ch); k++ {
			l := [2]string{ch[k], ch[k+1]}
			if l[0] > l[1] {
				l[0], l[1] = l[1], l[0]
			}
			if j, ok := byLink[l]; ok {
				a, b := find(i), find(j)
				parent[max(a, b)] = min(a, b)
			} else {
				byLink[l] = i
			}
		}
	}
	size := map[int]int{}
	for i := range chains {
		size[find(i)]++
	}
	out := make([]string, len(chains))
	for i := range chains {
		if r := find(i); size[r] > 1 {
			out[i] = "g" + strconv.Itoa(r)
		}
	}
	return out
}

// controllerClient returns the HTTP client of --controller: TLS with the
// controller's CA and a client certificate when given.
func controllerClient(caFile, certFile, keyFile string) (*http.Client, error) {
	if caFile == "" && certFile == "" {
		return &http.Client{}, nil
	}
	if caFile == "" || certFile == "" || keyFile == "" {
		return nil, usageErrorf("--controller-ca, --controller-cert and --controller-key go together")
	}
	var pems [3][]byte
	for i, f := range []string{caFile, certFile, keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		pems[i] = b
	}
	cfg, err := pki.ClientTLSConfig(pems[0], pems[1], pems[2])
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}, nil
}
