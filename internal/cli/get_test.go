package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/origin/origintest"
)

func TestGetCommand(t *testing.T) {
	var urls []string
	for i := 0; i < 2; i++ {
		_, addr := origintest.Start(t, origin.Config{Seed: 3})
		urls = append(urls, fmt.Sprintf("http://%s/obj?size=1000000", addr))
	}
	out := filepath.Join(t.TempDir(), "obj")
	sum := origin.Sum(3, 1000000)
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), []string{"get", "--json", "-o", out, "--sha256", fmt.Sprintf("%x", sum), "--block", "65536", urls[0], urls[1]}, nil, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var st mget.Stats
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	b, _ := os.ReadFile(out)
	if sha256.Sum256(b) != sum || len(st.Subflows) != 2 || st.Identity.Size != 1000000 {
		t.Errorf("file hash ok %v, %d sub-flows, size %d", sha256.Sum256(b) == sum, len(st.Subflows), st.Identity.Size)
	}
	for _, bad := range [][]string{
		{"get"},
		{"get", "--sha256", "abc", urls[0]},
		{"get", "--paths", "3", "--via", "127.0.0.1:1", urls[0]},
		{"get", "--block", "0", urls[0]},
	} {
		stderr.Reset()
		if code := Run(context.Background(), bad, nil, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d; want 2 (usage)", strings.Join(bad, " "), code)
		}
	}
	if code := Run(context.Background(), []string{"get", "-o", out, "ftp://x/y"}, nil, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "http") {
		t.Errorf("ftp URL: exit %d, %q", code, stderr.String())
	}
}
