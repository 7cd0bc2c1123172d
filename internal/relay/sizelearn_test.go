package relay

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// hintOf is l.hint's size only.
func hintOf(l *sizeLearner, k sizeKeys, static int64) int64 {
	v, _ := l.hint(k, static)
	return v
}

// fakeClock is a learner clock moved by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestSizeLearnerStaticUntilEnoughFlows(t *testing.T) {
	l := newSizeLearner(SizeLearnConfig{MinFlows: 3, Window: 5})
	a := sizeKeys{base: "svc a"}
	for i := range 2 {
		l.observe(a, 500_000)
		if got, src := l.hint(a, 14_000); got != 14_000 || src != hintStatic {
			t.Fatalf("after %d flows hint = %d (%s); want the static 14000", i+1, got, src)
		}
	}
	l.observe(a, 500_000)
	if got, src := l.hint(a, 14_000); got != 500_000 || src != hintLearned {
		t.Errorf("after 3 flows hint = %d (%s); want the learned 500000", got, src)
	}
	// Keys are learned apart.
	if got, src := l.hint(sizeKeys{base: "svc b"}, 14_000); got != 14_000 || src != hintStatic {
		t.Errorf("unseen key: hint = %d (%s); want static", got, src)
	}
	// Empty flows say nothing.
	for range 10 {
		l.observe(sizeKeys{base: "svc c"}, 0)
	}
	if got := hintOf(l, sizeKeys{base: "svc c"}, 7); got != 7 {
		t.Errorf("key of empty flows: hint = %d; want static", got)
	}
}

// TestSizeLearnerQuantile: the estimate is the configured quantile of the
// window by nearest rank (default the upper quartile): a minority of
// outliers on either side does not move it, a change of the objects does
// once it fills the window's upper part, and old flows leave the window.
func TestSizeLearnerQuantile(t *testing.T) {
	k := sizeKeys{base: "k"}
	for _, tc := range []struct {
		q    float64
		vals []int64
		want int64
	}{
		{0.5, []int64{100, 110, 90, 1 << 40, 1}, 100},            // median
		{0.5, []int64{10, 40, 20, 30}, 20},                       // lower middle of an even count
		{0, []int64{10, 40, 20, 30}, 30},                         // default 0.75: 3rd of 4
		{0.75, []int64{5, 1, 4, 2, 3, 8, 7, 6}, 6},               // 6th of 8
		{0.75, []int64{5, 1, 4, 2, 3, 8, 7, 6, 1 << 40}, 7},      // one outlier: 7th of 9
		{0.9, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 9},         // 9th of 10
		{1, []int64{1, 2, 3, 1 << 30, 5}, 1 << 30},               // the maximum
		{0.75, []int64{7}, 7},                                    // one flow
		{0.75, []int64{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 100}, 9}, // a late large file
	} {
		l := newSizeLearner(SizeLearnConfig{MinFlows: 1, Window: 16, Quantile: tc.q})
		for _, v := range tc.vals {
			l.observe(k, v)
		}
		if got := hintOf(l, k, 0); got != tc.want {
			t.Errorf("quantile %v of %v = %d; want %d", tc.q, tc.vals, got, tc.want)
		}
	}
	// The window turns over: only the last 5 flows count.
	l := newSizeLearner(SizeLearnConfig{MinFlows: 1, Window: 5, Quantile: 0.5})
	for _, v := range []int64{100, 110, 90, 1 << 40, 1} {
		l.observe(k, v)
	}
	for range 3 { // the window is now 5000 5000 5000 2^40 1
		l.observe(k, 5000)
	}
	if got := hintOf(l, k, 0); got != 5000 {
		t.Errorf("after three 5000s in a window of 5: hint = %d; want 5000", got)
	}
	for range 5 {
		l.observe(k, 42)
	}
	if got := hintOf(l, k, 0); got != 42 {
		t.Errorf("after the window turned over: hint = %d; want 42", got)
	}
}

// TestSizeLearnerDecay: sizes older than max_age no longer count; a key
// left with fewer than min_flows recent sizes falls back to the static
// hint until new flows refill it, and then only the new sizes count.
func TestSizeLearnerDecay(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	l := newSizeLearner(SizeLearnConfig{MinFlows: 3, Window: 8, Quantile: 0.5, MaxAge: Duration(10 * time.Minute)})
	l.now = clk.now
	k := sizeKeys{base: "dst x:80"}
	for range 4 {
		l.observe(k, 1_000_000)
		clk.t = clk.t.Add(time.Minute)
	}
	if got, src := l.hint(k, 5); got != 1_000_000 || src != hintLearned {
		t.Fatalf("hint = %d (%s); want 1000000 learned", got, src)
	}
	clk.t = clk.t.Add(8 * time.Minute) // the first two sizes are 12 and 11 min old
	if got := hintOf(l, k, 5); got != 5 {
		t.Errorf("two recent sizes of min 3: hint = %d; want static 5", got)
	}
	for range 2 {
		l.observe(k, 20_000)
	}
	// Recent: two 1M (10 and 9 min old) and two 20k: the lower middle.
	if got := hintOf(l, k, 5); got != 20_000 {
		t.Errorf("hint = %d; want 20000", got)
	}
	clk.t = clk.t.Add(11 * time.Minute)
	if got := hintOf(l, k, 5); got != 5 {
		t.Errorf("all sizes older than max_age: hint = %d; want static 5", got)
	}
	for range 3 {
		l.observe(k, 30_000)
	}
	if got := hintOf(l, k, 5); got != 30_000 {
		t.Errorf("after three new flows: hint = %d; want 30000 (the old sizes forgotten)", got)
	}
	if n := len(l.keys[k.base].Value.(*sizeKey).v); n != 3 {
		t.Errorf("%d sizes kept; want the 3 recent ones", n)
	}
}

// TestSizeLearnerLRU: the protected keys (those that reached min_flows)
// are forgotten least recently used first, where a lookup counts as a
// use; the probation keys within their own quarter of max_keys.
func TestSizeLearnerLRU(t *testing.T) {
	l := newSizeLearner(SizeLearnConfig{MinFlows: 2, Window: 2, MaxKeys: 8}) // probation 2, protected 6
	key := func(i int) sizeKeys { return sizeKeys{base: fmt.Sprint("k", i)} }
	for i := range 6 {
		l.observe(key(i), 100)
		l.observe(key(i), 100)
	}
	hintOf(l, key(0), -1) // k0 used: k1 is now the least recently used
	l.observe(key(6), 1)
	l.observe(key(6), 1) // promoted: the protected list is full, k1 goes
	if got := hintOf(l, key(1), -1); got != -1 {
		t.Errorf("k1 should have been forgotten; hint = %d", got)
	}
	for _, i := range []int{0, 2, 3, 4, 5, 6} {
		if got := hintOf(l, key(i), -1); got == -1 {
			t.Errorf("k%d forgotten; want kept", i)
		}
	}
	// Probation: three new keys of one flow each; the first is forgotten.
	for i := 10; i < 13; i++ {
		l.observe(key(i), 5)
	}
	if _, ok := l.keys["k10"]; ok {
		t.Error("k10 kept; want forgotten past the probation cap 2")
	}
	if n, ev := l.stats(); n != 8 || ev != 2 {
		t.Errorf("stats = %d keys, %d evicted; want 8, 2", n, ev)
	}
}

// TestSizeLearnerHostileChurn: a client that opens one flow each to a
// hundred thousand destinations neither grows the learner past max_keys
// (nor its sizes past max_keys x window) nor makes it forget the
// destinations that answer lookups.
func TestSizeLearnerHostileChurn(t *testing.T) {
	const maxKeys, window = 64, 4
	l := newSizeLearner(SizeLearnConfig{MinFlows: 3, Window: window, MaxKeys: maxKeys})
	var legit []sizeKeys
	for i := range 20 { // 40 keys (base and path) of the 48 protected
		k := sizeKeys{base: fmt.Sprintf("dst legit%d:443", i), path: fmt.Sprintf("dst legit%d:443 /p", i)}
		legit = append(legit, k)
		for range 3 {
			l.observe(k, int64(1000*(i+1)))
		}
	}
	for i := range 20_000 {
		l.observe(sizeKeys{base: fmt.Sprintf("dst 10.%d.%d.%d:80", i>>16, (i>>8)&255, i&255), path: fmt.Sprintf("dst 10.%d:80 /%d", i, i)}, 1)
		if i%997 == 0 {
			l.mu.Lock()
			n, samples := len(l.keys), 0
			for _, e := range l.keys {
				samples += cap(e.Value.(*sizeKey).v)
			}
			pl, pr := l.probation.Len(), l.protected.Len()
			l.mu.Unlock()
			if n > maxKeys || samples > maxKeys*window || pl+pr != n {
				t.Fatalf("after %d hostile flows: %d keys (lists %d+%d), %d sizes; want <= %d keys, <= %d sizes", i+1, n, pl, pr, samples, maxKeys, maxKeys*window)
			}
		}
	}
	for i, k := range legit {
		if got, src := l.hint(k, -1); got != int64(1000*(i+1)) || src != hintPath {
			t.Errorf("legit key %d: hint = %d (%s); want %d from its path key", i, got, src, 1000*(i+1))
		}
	}
}

func TestSizeLearnerOffAndNil(t *testing.T) {
	if l := newSizeLearner(SizeLearnConfig{MinFlows: -1}); l != nil {
		t.Fatal("min_flows -1 should turn learning off")
	}
	var l *sizeLearner
	l.observe(sizeKeys{base: "k"}, 10)
	if got, src := l.hint(sizeKeys{base: "k"}, 5); got != 5 || src != hintStatic {
		t.Errorf("nil learner hint = %d (%s); want static", got, src)
	}
	if n, ev := l.stats(); n != 0 || ev != 0 {
		t.Errorf("nil learner stats = %d, %d", n, ev)
	}
	d := newSizeLearner(SizeLearnConfig{})
	if d.minFlows != DefaultSizeMinFlows || d.window != DefaultSizeWindow || d.probCap+d.protCap != DefaultSizeMaxKeys ||
		d.quantile != DefaultSizeQuantile || d.maxAge != DefaultSizeMaxAge {
		t.Errorf("defaults = %d/%d/%d+%d/%v/%v", d.minFlows, d.window, d.probCap, d.protCap, d.quantile, d.maxAge)
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
		{SizeLearnConfig{MaxKeys: 1}, "max_keys"},
		{SizeLearnConfig{Quantile: 0.2}, "quantile"},
		{SizeLearnConfig{Quantile: 1.5}, "quantile"},
		{SizeLearnConfig{Quantile: 1, MaxAge: Duration(time.Minute), MaxKeys: 2}, ""},
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
				if h := hintOf(l, k, 1); h <= 0 {
					t.Errorf("hint %d", h)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n, _ := l.stats(); n > 5 {
		t.Errorf("%d keys; want at most 5", n)
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
	if got := hintOf(l, video, 1); got != 20_000 {
		t.Errorf("unseen path: hint = %d; want the base key's 20000", got)
	}
	l.observe(video, 9_000_000)
	if got := hintOf(l, video, 1); got != 20_000 {
		t.Errorf("path with 1 flow: hint = %d; want the base key's", got)
	}
	l.observe(video, 9_000_000)
	if got := hintOf(l, video, 1); got != 9_000_000 {
		t.Errorf("path with 2 flows: hint = %d; want 9000000", got)
	}
	if got := hintOf(l, page, 1); got != 20_000 {
		t.Errorf("page: hint = %d; want 20000", got)
	}
	if got := hintOf(l, sizeKeys{base: "svc web"}, 1); got != 9_000_000 { // upper quartile of 20k x3, 9M x2
		t.Errorf("base: hint = %d; want 9000000", got)
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
