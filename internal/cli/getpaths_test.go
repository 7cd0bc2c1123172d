package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/origin/origintest"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

func TestCoupleChains(t *testing.T) {
	for _, tc := range []struct {
		chains [][]string
		want   []string
	}{
		{[][]string{{"a", "c"}, {"a", "b", "c"}}, []string{"", ""}},
		{[][]string{{"a", "b", "c"}, {"a", "b", "d", "c"}}, []string{"g0", "g0"}},
		{[][]string{{"a", "c"}, {"a", "b", "c"}, {"c", "a"}}, []string{"g0", "", "g0"}}, // a link either way
		{[][]string{{"a", "b"}, {"c", "d"}, {"b", "c", "d"}, {"x", "b", "a"}}, []string{"g0", "g1", "g1", "g0"}},
		{[][]string{{"a", "b"}, {"c", "d"}, {"b", "c", "d"}, {"x", "c", "d", "b", "a"}}, []string{"g0", "g0", "g0", "g0"}}, // joined through the last
		{[][]string{{"a"}, {"a"}}, []string{"", ""}},
	} {
		if got := coupleChains(tc.chains); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("coupleChains(%v) = %q; want %q", tc.chains, got, tc.want)
		}
	}
}

// TestGetControllerPaths: `mosto get --controller` takes each mirror's
// chains from GET /v1/paths and pins one sub-flow per chain through the
// proxy's CONNECT entry; the two mirrors' chains over a-c (and over
// a-b-c) share links, so they are coupled: one of each pair carries bytes.
func TestGetControllerPaths(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
		if c.ID == "a" {
			c.HTTPConnect = &relay.ConnectConfig{Listen: "127.0.0.1:0"}
		}
	}}, "a", "b", "c")
	var asked []string
	ctrl := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		asked = append(asked, r.URL.Path+"?"+q.Encode())
		if r.URL.Path != api.PathPaths || q.Get("from") != "a" || q.Get("to") != "c" || q.Get("k") != "2" {
			http.Error(rw, "unexpected query", http.StatusBadRequest)
			return
		}
		json.NewEncoder(rw).Encode(api.Paths{From: "a", To: "c", Chains: []api.PathChain{{Path: []string{"a", "c"}}, {Path: []string{"a", "b", "c"}}}})
	}))
	defer ctrl.Close()
	const size = 2_000_000
	var urls []string
	for range 2 {
		_, addr := origintest.Start(t, origin.Config{Seed: 3})
		urls = append(urls, fmt.Sprintf("http://%s/obj?size=%d", addr, size))
	}
	out := filepath.Join(t.TempDir(), "obj")
	sum := origin.Sum(3, size)
	var stdout, stderr bytes.Buffer
	args := []string{"get", "--json", "-o", out, "--sha256", fmt.Sprintf("%x", sum), "--block", "65536",
		"--controller", ctrl.URL, "--from", "a", "--to", "c", "--paths", "2", "--connect", w.Members["a"].HTTPConnectAddr().String(), urls[0], urls[1]}
	if code := Run(context.Background(), args, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var st mget.Stats
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	b, _ := os.ReadFile(out)
	if sha256.Sum256(b) != sum {
		t.Fatalf("file differs from the object")
	}
	if len(asked) != 2 || len(st.Subflows) != 4 {
		t.Fatalf("controller asked %q, %d sub-flows; want 2 questions, 4 sub-flows", asked, len(st.Subflows))
	}
	carried := map[string]int{}
	for _, sf := range st.Subflows {
		if sf.Group == "" || !strings.HasPrefix(sf.Path, "chain a>") {
			t.Errorf("sub-flow %s %q group %q: want a pinned chain in a coupled group", sf.URL, sf.Path, sf.Group)
		}
		if sf.Bytes > 0 {
			carried[sf.Group]++
		}
		if sf.Stalls > 0 || sf.Errors > 0 {
			t.Errorf("sub-flow %s %s: %d stalls, %d errors (%s)", sf.URL, sf.Path, sf.Stalls, sf.Errors, sf.LastErr)
		}
	}
	for g, n := range carried {
		if n > 1 {
			t.Errorf("group %s: %d sub-flows carried bytes; want one at a time", g, n)
		}
	}
	for _, bad := range [][]string{
		{"get", "--controller", ctrl.URL, "--paths", "2", urls[0]},
		{"get", "--controller", ctrl.URL, "--from", "a", "--to", "c,c,c", "--connect", "127.0.0.1:1", "--paths", "2", urls[0]},
		{"get", "--controller", ctrl.URL, "--from", "a", "--to", "c", "--connect", "127.0.0.1:1", urls[0]},
	} {
		stderr.Reset()
		if code := Run(context.Background(), bad, nil, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d; want 2 (usage): %s", strings.Join(bad, " "), code, stderr.String())
		}
	}
}
