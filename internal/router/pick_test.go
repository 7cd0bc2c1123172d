package router

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

func threeSurrogates() []Surrogate {
	return []Surrogate{{"a", "10.0.0.1:80"}, {"b", "10.0.0.2:80"}, {"c", "10.0.0.3:80"}}
}

func TestPickNearest(t *testing.T) {
	ms := time.Millisecond
	p, err := NewPicker(PickConfig{
		Surrogates: threeSurrogates(),
		Locations: []Location{
			{netip.MustParsePrefix("192.168.0.0/16"), map[string]time.Duration{"a": 30 * ms, "b": 5 * ms, "c": 6 * ms}},
			{netip.MustParsePrefix("192.168.7.0/24"), map[string]time.Duration{"a": 1 * ms, "b": 50 * ms, "c": 50 * ms}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	far := netip.MustParseAddr("192.168.1.1")
	near := netip.MustParseAddr("192.168.7.9")
	if got := p.Nearest(far).Name; got != "b" {
		t.Errorf("Nearest(%v) = %s; want b", far, got)
	}
	if got := p.Nearest(near).Name; got != "a" {
		t.Errorf("Nearest(%v) = %s; want a (longest prefix)", near, got)
	}
	seen := map[string]int{}
	for k := range 200 {
		i := p.Pick(far, fmt.Sprintf("/obj/%d", k))
		p.Done(i)
		seen[p.Surrogates()[i].Name]++
	}
	// b and c are within the 2 ms slack; a is not.
	if seen["a"] != 0 || seen["b"] < 60 || seen["c"] < 60 {
		t.Errorf("picks for a client near b and c = %v; want URLs spread over b and c only", seen)
	}
	for k := range 50 {
		i := p.Pick(near, fmt.Sprintf("/obj/%d", k))
		p.Done(i)
		if p.Surrogates()[i].Name != "a" {
			t.Fatalf("Pick(%v) = %s; want a", near, p.Surrogates()[i].Name)
		}
	}
	// No location: every surrogate is a candidate.
	if got := p.Nearest(netip.MustParseAddr("10.1.1.1")).Name; got != "a" {
		t.Errorf("Nearest(unknown) = %s; want the first surrogate", got)
	}
}

// Rendezvous hashing: a URL always maps to the same surrogate, and removing
// a surrogate moves only the URLs it had.
func TestPickConsistent(t *testing.T) {
	all, err := NewPicker(PickConfig{Surrogates: threeSurrogates()})
	if err != nil {
		t.Fatal(err)
	}
	two, err := NewPicker(PickConfig{Surrogates: threeSurrogates()[:2]})
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("10.9.9.9")
	moved, onC := 0, 0
	for k := range 300 {
		url := fmt.Sprintf("/obj?size=%d", k)
		i := all.Pick(client, url)
		all.Done(i)
		if j := all.Pick(client, url); j != i {
			t.Fatalf("Pick(%q) = %d then %d", url, i, j)
		} else {
			all.Done(j)
		}
		j := two.Pick(client, url)
		two.Done(j)
		if i == 2 {
			onC++
			continue
		}
		if i != j {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d URLs not on the removed surrogate moved", moved)
	}
	if onC < 60 || onC > 140 {
		t.Errorf("%d of 300 URLs on c; want about a third", onC)
	}
}

// Bounded load: a surrogate holding many sessions is passed over for the
// URL's next candidate.
func TestPickLoad(t *testing.T) {
	p, err := NewPicker(PickConfig{Surrogates: threeSurrogates()[:2]})
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("10.9.9.9")
	url := "/hot"
	first := p.Pick(client, url)
	picks := []int{first}
	for range 9 {
		picks = append(picks, p.Pick(client, url))
	}
	if p.Load(0)+p.Load(1) != 10 {
		t.Fatalf("loads %d+%d; want 10", p.Load(0), p.Load(1))
	}
	other := 1 - first
	if p.Load(other) < 3 {
		t.Errorf("hot URL: loads %d (preferred) / %d (other); want the other to take sessions over the bound", p.Load(first), p.Load(other))
	}
	for _, i := range picks {
		p.Done(i)
	}
	if p.Load(0) != 0 || p.Load(1) != 0 {
		t.Errorf("loads after Done = %d, %d", p.Load(0), p.Load(1))
	}
}

func TestNewPickerErrors(t *testing.T) {
	for _, cfg := range []PickConfig{
		{},
		{Surrogates: []Surrogate{{"a", ""}}},
		{Surrogates: []Surrogate{{"a", "x:1"}, {"a", "y:1"}}},
		{Surrogates: []Surrogate{{"a", "x:1"}}, Locations: []Location{{netip.MustParsePrefix("10.0.0.0/8"), map[string]time.Duration{"z": 1}}}},
		{Surrogates: []Surrogate{{"a", "x:1"}}, LoadFactor: 0.5},
	} {
		if _, err := NewPicker(cfg); err == nil {
			t.Errorf("NewPicker(%+v) succeeded; want an error", cfg)
		}
	}
}
