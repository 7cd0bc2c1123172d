package api_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/pathcomp"
)

// TestOpenAPIMatchesTypes keeps openapi.yaml in step with the Go types: every
// schema lists exactly the JSON fields of its type, and every path exists.
func TestOpenAPIMatchesTypes(t *testing.T) {
	var doc struct {
		Paths      map[string]any `yaml:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	types := map[string]any{
		"FEP": api.FEP{}, "FEPList": api.FEPList{}, "JoinRequest": api.JoinRequest{}, "JoinResponse": api.JoinResponse{},
		"Target": api.Target{}, "Targets": api.Targets{}, "Sample": api.Sample{}, "Report": api.Report{},
		"ReportResult": api.ReportResult{}, "Keys": api.Keys{}, "FEPKey": api.FEPKey{}, "Egress": api.Egress{}, "Table": api.Table{},
		"Matrix": api.Matrix{}, "Health": api.Health{}, "Error": api.Error{},
		"TableFile": pathcomp.TableFile{}, "ChainEntry": pathcomp.ChainEntry{},
		"DestTarget": api.DestTarget{}, "Destination": api.Destination{}, "DestSample": api.DestSample{},
		"DestinationList": api.DestinationList{}, "ProxyStats": api.ProxyStats{},
		"Paths": api.Paths{}, "PathChain": api.PathChain{},
		"SegmentSample": api.SegmentSample{}, "Intercept": api.Intercept{},
	}
	for name, v := range types {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("openapi.yaml has no schema %s", name)
			continue
		}
		var want, got []string
		rt := reflect.TypeOf(v)
		for i := 0; i < rt.NumField(); i++ {
			tag, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if tag != "" && tag != "-" {
				want = append(want, tag)
			}
		}
		for p := range s.Properties {
			got = append(got, p)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("schema %s properties %v; Go type has %v", name, got, want)
		}
	}
	for _, p := range []string{api.PathJoin, api.PathFEPs, api.PathFEPs + "/{id}", api.PathFEPs + "/{id}/targets",
		api.PathReports, api.PathTables + "{lop}", api.PathMatrix, api.PathHealth, api.PathMetrics, api.PathOpenAPI,
		api.PathDestinations, api.PathDestinations + "/{id}", api.PathPaths} {
		if _, ok := doc.Paths[p]; !ok {
			t.Errorf("openapi.yaml has no path %s", p)
		}
	}
}
