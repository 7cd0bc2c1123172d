package cli

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/router"
)

func TestPickConfigFlags(t *testing.T) {
	cfg, err := pickConfig([]string{"eu=10.0.0.1:80@London", "asia=10.0.0.2:80@Osaka"},
		[]string{"10.1.0.0/16@Dublin", "10.3.0.0/16=eu:9,asia:1.5"}, "wonderproxy", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Surrogates) != 2 || len(cfg.Locations) != 2 {
		t.Fatalf("config %+v", cfg)
	}
	if got := cfg.Locations[0].RTT["asia"]; got != 1500*time.Microsecond {
		t.Errorf("static RTT = %v; want 1.5ms", got)
	}
	for _, bad := range [][2][]string{
		{{"eu"}, nil},
		{{"eu=nowhere"}, nil},
		{{"eu=10.0.0.1:80"}, {"10.1.0.0/16@Dublin"}},
		{{"eu=10.0.0.1:80"}, {"10.1.0.0/16=eu"}},
		{{"eu=10.0.0.1:80"}, {"nonsense"}},
	} {
		if _, err := pickConfig(bad[0], bad[1], "", ""); err == nil {
			t.Errorf("pickConfig(%q, %q) succeeded", bad[0], bad[1])
		}
	}
}

// --site: a client in New York whose nearest surrogate is in Chicago is
// sent to Amsterdam by a router in London (the response crosses the
// router), and to Chicago by its --near location.
func TestSiteRanksFromRouter(t *testing.T) {
	surr := []string{"ams=10.0.0.1:80@Amsterdam", "chi=10.0.0.2:80@Chicago"}
	client := netip.MustParseAddr("10.4.0.9")
	for _, c := range []struct {
		near     []string
		triangle string
		want     string
	}{
		{[]string{"10.4.0.0/16@NewYork"}, "", "chi"},
		{siteNear("London"), "", "ams"},
		// --placement surrogate: the answer goes client -> London ->
		// surrogate -> client; from Chicago that is shortest via Chicago.
		{[]string{"10.4.0.0/16@Chicago"}, "London", "chi"},
		{[]string{"10.4.0.0/16@Dublin"}, "London", "ams"},
	} {
		cfg, err := pickConfig(surr, c.near, "wonderproxy", c.triangle)
		if err != nil {
			t.Fatal(err)
		}
		p, err := router.NewPicker(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if c.triangle != "" {
			// Chicago -> Chicago is shorter than through London;
			// Amsterdam -> Dublin is not shorter than Amsterdam ->
			// London -> Dublin by much: either way, the table says one.
			if c.want == "chi" && !p.Triangle(client, netip.MustParseAddr("10.0.0.2")) {
				t.Errorf("near %q: Chicago's answer not placed at the surrogate", c.near)
			}
			if p.Triangle(client, netip.MustParseAddr("10.0.0.9")) != true {
				t.Error("an unknown surrogate is not placed at the surrogate by default")
			}
		}
		for _, url := range []string{"/a", "/b", "/c", "/d"} {
			i := p.Pick(client, url)
			if got := p.Surrogates()[i].Name; got != c.want {
				t.Errorf("near %q: Pick(%s, %s) = %s; want %s", c.near, client, url, got, c.want)
			}
			p.Done(i)
		}
	}
}

func TestRouterUsage(t *testing.T) {
	for _, args := range [][]string{
		{"router", "--listen", "127.0.0.1:0", "--mode", "302", "--site", "London", "--rtt-matrix", "wonderproxy", "--surrogate", "a=127.0.0.1:1@London"},
		{"router"},
		{"router", "--listen", "127.0.0.1:0", "--mode", "nope", "--surrogate", "a=127.0.0.1:1"},
		{"router", "--listen", "127.0.0.1:0"},
		{"router", "--listen", "127.0.0.1:0", "--mode", "handoff", "--surrogate", "a=127.0.0.1:1", "--placement", "elsewhere"},
		{"router", "--listen", "127.0.0.1:0", "--mode", "proxy", "--surrogate", "a=127.0.0.1:1", "--placement", "surrogate", "--agent", "127.0.0.1=127.0.0.1:7070"},
		{"router", "--listen", "127.0.0.1:0", "--mode", "handoff", "--surrogate", "a=127.0.0.1:1", "--placement", "surrogate"},
		{"router", "--listen", "127.0.0.1:0", "--mode", "handoff", "--surrogate", "a=127.0.0.1:1", "--agent", "127.0.0.1=127.0.0.1:7070"},
		{"router", "--listen", "127.0.0.1:0", "--mode", "handoff", "--surrogate", "a=127.0.0.1:1", "--placement", "surrogate", "--agent", "nohost", "--agent-key-file", "/dev/null"},
		{"xagent"},
		{"xagent", "--listen", "127.0.0.1:0", "--key-file", "/dev/null"},
		{"xagent", "--listen", "127.0.0.1:0", "--key-file", "/nonexistent/key"},
	} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), args, nil, &out, &errb); code != 2 {
			t.Errorf("%q exit %d; want 2 (%s)", args, code, errb.String())
		}
	}
}
