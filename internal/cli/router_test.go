package cli

import (
	"bytes"
	"context"
	"testing"
	"time"
)

func TestPickConfigFlags(t *testing.T) {
	cfg, err := pickConfig([]string{"eu=10.0.0.1:80@London", "asia=10.0.0.2:80@Osaka"},
		[]string{"10.1.0.0/16@Dublin", "10.3.0.0/16=eu:9,asia:1.5"}, "wonderproxy")
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
		if _, err := pickConfig(bad[0], bad[1], ""); err == nil {
			t.Errorf("pickConfig(%q, %q) succeeded", bad[0], bad[1])
		}
	}
}

func TestRouterUsage(t *testing.T) {
	for _, args := range [][]string{
		{"router"},
		{"router", "--listen", "127.0.0.1:0", "--mode", "nope", "--surrogate", "a=127.0.0.1:1"},
		{"router", "--listen", "127.0.0.1:0"},
	} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), args, nil, &out, &errb); code != 2 {
			t.Errorf("%q exit %d; want 2 (%s)", args, code, errb.String())
		}
	}
}
