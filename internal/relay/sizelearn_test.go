package relay

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestSizeLearnerStaticUntilEnoughFlows(t *testing.T) {
	l := newSizeLearner(SizeLearnConfig{MinFlows: 3, Window: 5})
	for i := range 2 {
		l.observe(sizeKeys{base: "svc a"}, 500_000)
		if got := l.hint(sizeKeys{base: "svc a"}, 14_000); got != 14_000 {
			t.Fatalf("after %d flows hint = %d; want the static 14000", i+1, got)
		}
	}
	l.observe(sizeKeys{base: "svc a"}, 500_000)
	if got := l.hint(sizeKeys{base: "svc a"}, 14_000); got != 500_000 {
		t.Errorf("after 3 flows hint = %d; want the learned 500000", got)
	}
	// Keys are learned apart.
	if got := l.hint(sizeKeys{base: "svc b"}, 14_000); got != 14_000 {
		t.Errorf("unseen key: hint = %d; want static", got)
	}
	// Empty flows say nothing.
	for range 10 {
		l.observe(sizeKeys{base: "svc c"}, 0)
	}
	if got := l.hint(sizeKeys{base: "svc c"}, 7); got != 7 {
		t.Errorf("key of empty flows: hint = %d; want static", got)
	}
}

// TestSizeLearnerRobust: the estimate is the median of the window: a
// minority of outliers does not move it, a change of the objects does once
// it is the majority of the window, and old flows leave the window.
func TestSizeLearnerRobust(t *testing.T) {
	l := newSizeLearner(SizeLearnConfig{MinFlows: 1, Window: 5})
	for _, v := range []int64{100, 110, 90, 1 << 40, 1} { // two outliers
		l.observe(sizeKeys{base: "k"}, v)
	}
	if got := l.hint(sizeKeys{base: "k"}, 0); got != 100 {
		t.Errorf("median of 100 110 90 2^40 1 = %d; want 100", got)
	}
	for range 3 { // the window is now 5000 5000 5000 2^40 1
		l.observe(sizeKeys{base: "k"}, 5000)
	}
	if got := l.hint(sizeKeys{base: "k"}, 0); got != 5000 {
		t.Errorf("after three 5000s in a window of 5: hint = %d; want 5000", got)
	}
	for range 5 {
		l.observe(sizeKeys{base: "k"}, 42)
	}
	if got := l.hint(sizeKeys{base: "k"}, 0); got != 42 {
		t.Errorf("after the window turned over: hint = %d; want 42", got)
	}
	// Even count: the lower middle (errs towards fewer rounds).
	e := newSizeLearner(SizeLearnConfig{MinFlows: 1, Window: 4})
	for _, v := range []int64{10, 40, 20, 30} {
		e.observe(sizeKeys{base: "k"}, v)
	}
	if got := e.hint(sizeKeys{base: "k"}, 0); got != 20 {
		t.Errorf("median of 10 40 20 30 = %d; want 20 (lower middle)", got)
	}
}

func TestSizeLearnerBoundedKeys(t *testing.T) {
	l := newSizeLearner(SizeLearnConfig{MinFlows: 1, Window: 2, MaxKeys: 3})
	for i := range 3 {
		l.observe(sizeKeys{base: fmt.Sprint("k", i)}, int64(100+i))
	}
	l.observe(sizeKeys{base: "k0"}, 100) // k1 is now the least recently updated
	l.observe(sizeKeys{base: "k3"}, 103)
	if len(l.keys) != 3 {
		t.Fatalf("%d keys; want at most 3", len(l.keys))
	}
	if got := l.hint(sizeKeys{base: "k1"}, -1); got != -1 {
		t.Errorf("k1 should have been forgotten; hint = %d", got)
	}
	for _, k := range []string{"k0", "k2", "k3"} {
		if got := l.hint(sizeKeys{base: k}, -1); got == -1 {
			t.Errorf("%s forgotten; want kept", k)
		}
	}
}

func TestSizeLearnerOffAndNil(t *testing.T) {
	if l := newSizeLearner(SizeLearnConfig{MinFlows: -1}); l != nil {
		t.Fatal("min_flows -1 should turn learning off")
	}
	var l *sizeLearner
	l.observe(sizeKeys{base: "k"}, 10)
	if got := l.hint(sizeKeys{base: "k"}, 5); got != 5 {
		t.Errorf("nil learner hint = %d; want static", got)
	}
	d := newSizeLearner(SizeLearnConfig{})
	if d.minFlows != DefaultSizeMinFlows || d.window != DefaultSizeWindow || d.maxKeys != DefaultSizeMaxKeys {
		t.Errorf("defaults = %d/%d/%d", d.minFlows, d.window, d.maxKeys)
	}
}

func TestSizeLearnConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c    SizeLearnConfig
		want string
	}{
		{SizeLearnConfig{MinFlows: -2}, "min_flows"},
		{SizeLearnConfig{Window: -1}, "window"},
		{SizeLearnConfig{Window: MaxSizeWindow + 1}, "window"},
		{SizeLearnConfig{MaxKeys: -1}, "max_keys"},
		{SizeLearnConfig{MinFlows: 9, Window: 4}, "exceeds window"},
		{SizeLearnConfig{}, ""},
		{SizeLearnConfig{MinFlows: -1}, ""},
	} {
		var errs []string
		tc.c.validate(func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) })
		got := strings.Join(errs, "; ")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("validate(%+v) = %q; want %q", tc.c, got, tc.want)
		}
	}
}

func TestSizeLearnerConcurrent(t *testing.T) {
	l := newSizeLearner(SizeLearnConfig{MinFlows: 1, Window: 7, MaxKeys: 5})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				k := sizeKeys{base: fmt.Sprint("k", (g+i)%9), path: fmt.Sprint("k", (g+i)%9, " /p")}
				l.observe(k, int64(1000+i))
				if h := l.hint(k, 1); h <= 0 {
					t.Errorf("hint %d", h)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(l.keys) > 5 {
		t.Errorf("%d keys; want at most 5", len(l.keys))
	}
}

func TestKeysOf(t *testing.T) {
	tgt, err := ParseTarget("example.org:443")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		service string
		early   string
		base    string
		path    string
	}{
		{"web", "", "svc web", ""},
		{"", "", "dst example.org:443", ""},
		{"web", "GET /video/a.mp4 HTTP/1.1\r\nHost: x\r\n", "svc web", "svc web /video"},
		{"", "HEAD /index.html?x=1 HTTP/1.1\r\n", "dst example.org:443", "dst example.org:443 /index.html"},
		{"web", "GET / HTTP/1.1\r\n", "svc web", "svc web /"},
		{"web", "GET /abc", "svc web", ""},                                       // cut inside the segment
		{"web", "\x16\x03\x01\x02\x00", "svc web", ""},                           // TLS
		{"web", "get /x HTTP/1.1\r\n", "svc web", ""},                            // not a method
		{"web", "GET x HTTP/1.1\r\n", "svc web", ""},                             // not a path
		{"web", "GET /a\x00b HTTP/1.1\r\n", "svc web", ""},                       // control byte
		{"web", "GET /" + strings.Repeat("a", 200) + " HTTP/1.1", "svc web", ""}, // over-long
	} {
		if got := keysOf(tc.service, tgt, []byte(tc.early)); got != (sizeKeys{tc.base, tc.path}) {
			t.Errorf("keysOf(%q, %q) = %+v; want %q, %q", tc.service, tc.early, got, tc.base, tc.path)
		}
	}
}

// TestSizeLearnerPathFallback: a path key is used once it saw enough
// flows; until then the base key (learned from every path) answers.
func TestSizeLearnerPathFallback(t *testing.T) {
	l := newSizeLearner(SizeLearnConfig{MinFlows: 2, Window: 8})
	video := sizeKeys{base: "svc web", path: "svc web /video"}
	page := sizeKeys{base: "svc web", path: "svc web /page"}
	for range 3 {
		l.observe(page, 20_000)
	}
	if got := l.hint(video, 1); got != 20_000 {
		t.Errorf("unseen path: hint = %d; want the base key's 20000", got)
	}
	l.observe(video, 9_000_000)
	if got := l.hint(video, 1); got != 20_000 {
		t.Errorf("path with 1 flow: hint = %d; want the base key's", got)
	}
	l.observe(video, 9_000_000)
	if got := l.hint(video, 1); got != 9_000_000 {
		t.Errorf("path with 2 flows: hint = %d; want 9000000", got)
	}
	if got := l.hint(page, 1); got != 20_000 {
		t.Errorf("page: hint = %d; want 20000", got)
	}
	if got := l.hint(sizeKeys{base: "svc web"}, 1); got != 20_000 { // median of 20k x3, 9M x2
		t.Errorf("base: hint = %d; want 20000", got)
	}
}

func FuzzHTTPPathPrefix(f *testing.F) {
	f.Add([]byte("GET /a/b HTTP/1.1\r\n"))
	f.Add([]byte("POST /?q HTTP/1.0"))
	f.Add([]byte("\x16\x03"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := httpPathPrefix(b)
		if p == "" {
			return
		}
		if p[0] != '/' || len(p) > maxPathKey || strings.ContainsAny(p[1:], "/?# ") {
			t.Errorf("httpPathPrefix(%q) = %q", b, p)
		}
		for _, c := range []byte(p) {
			if c < 0x21 || c > 0x7e {
				t.Errorf("httpPathPrefix(%q) = %q has byte %#x", b, p, c)
			}
		}
	})
}
