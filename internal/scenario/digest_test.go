package scenario

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogDigest checks the post-mortem of a discovery that did not
// converge: the last warnings and errors of every process's log, counted.
func TestLogDigest(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("controller.log", `time=1 level=INFO msg="controller serving"
2026/11/25 05:33:11 http: TLS handshake error from 10.77.0.1:59454: EOF
time=2 level=WARN msg="report refused" fep=a
`)
	a := write("proxy-a.log", `time=1 level=INFO msg="proxy serving"
time=1 level=INFO msg=registered fep=a
time=1 level=INFO msg="probe targets" fep=a peers=0 destinations=0
time=1 level=INFO msg="new table" fep=a version=1
time=1 level=INFO msg="new table" fep=a version=2
time=2 level=WARN msg=w1
time=3 level=ERROR msg=e2

time=4 level=DEBUG msg=d
time=5 level=WARN msg=w3
`)
	s := &Scenario{dir: dir, ctl: &controllerProc{}, proxies: []*proxyProc{{fep: "a", logf: a}, {fep: "b", logf: filepath.Join(dir, "none.log")}}}
	got := s.logDigest(2)
	for _, want := range []string{
		"controller: 3 log lines, 2 warnings/errors\n",
		"    2026/11/25 05:33:11 http: TLS handshake error",
		`    time=2 level=WARN msg="report refused" fep=a`,
		"proxy a: 10 log lines, 3 warnings/errors, the last 2\n" +
			"    time=1 level=INFO msg=registered fep=a\n" +
			"    time=1 level=INFO msg=\"new table\" fep=a version=2\n" +
			"    time=1 level=INFO msg=\"probe targets\" fep=a peers=0 destinations=0\n" +
			"    time=3 level=ERROR msg=e2\n    time=5 level=WARN msg=w3\n",
		"proxy b: open ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("digest lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "w1") || strings.Contains(got, "version=1") || strings.Contains(got, "serving") || strings.Contains(got, "DEBUG") {
		t.Errorf("digest has lines it should not:\n%s", got)
	}
}
