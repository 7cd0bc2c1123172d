package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/mosto-net/mosto/internal/api"
)

// matrixBackend serves a fixed matrix.
type matrixBackend struct {
	*fakeBackend
	m api.Matrix
}

func (b matrixBackend) Matrix(ctx context.Context) (api.Matrix, error) { return b.m, nil }

func TestPaths(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	// A-B-D (cheap), A-C-D (disjoint), A-B-C-D ...; B->D measured one way only.
	names := []string{"A", "B", "C", "D"}
	rtt := [][]*float64{
		{f(0), f(10), f(30), nil},
		{f(10), f(0), f(5), f(10)},
		{f(30), f(5), f(0), f(30)},
		{nil, nil, f(30), f(0)},
	}
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: matrixBackend{newFake(), api.Matrix{Names: names, RTTMS: rtt}}}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + api.PathPaths + "?from=A&to=D&k=2&size=10000")
	if err != nil {
		t.Fatal(err)
	}
	var p api.Paths
	json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(p.Chains) != 2 || p.Rounds != 1 {
		t.Fatalf("status %d, %+v", resp.StatusCode, p)
	}
	if !slices.Equal(p.Chains[0].Path, []string{"A", "B", "D"}) || !slices.Equal(p.Chains[1].Path, []string{"A", "C", "D"}) || len(p.Chains[1].Shared) != 0 {
		t.Errorf("chains %+v; want A-B-D then the disjoint A-C-D", p.Chains)
	}
	for q, want := range map[string]int{
		"?from=A&to=D&k=0&size=1":  400,
		"?from=A&to=D&k=2&size=x":  400,
		"?from=A&to=Z&k=2&size=1":  404,
		"?from=A&to=A&k=2&size=1":  400,
		"?from=A&to=D&k=99&size=1": 400,
	} {
		resp, err := http.Get(srv.URL + api.PathPaths + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d; want %d", q, resp.StatusCode, want)
		}
	}
}
