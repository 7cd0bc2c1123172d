package dashboard_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/cli/clitest"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/stats"
	"github.com/mosto-net/mosto/internal/testenv"
)

// screenshotsEnv names a directory where TestDashboardInChromium writes
// its screenshots (docs/ for docs/dashboard.md).
const screenshotsEnv = "MOSTO_DASHBOARD_SCREENSHOTS"

// TestMain lets the test binary act as the mosto binary (clitest).
func TestMain(m *testing.M) { clitest.Main(m) }

// cdp is a Chrome DevTools Protocol client over --remote-debugging-pipe
// (fd 3: commands to the browser, fd 4: its answers and events, each
// message ending with a NUL byte).
type cdp struct {
	w    io.Writer
	mu   sync.Mutex
	id   int
	wait map[int]chan cdpMsg
}

type cdpMsg struct {
	ID     int             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (c *cdp) readLoop(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		b, err := br.ReadBytes(0)
		if err != nil {
			c.mu.Lock()
			for _, ch := range c.wait {
				close(ch)
			}
			c.wait = nil
			c.mu.Unlock()
			return
		}
		var m cdpMsg
		if json.Unmarshal(b[:len(b)-1], &m) != nil || m.ID == 0 {
			continue // an event
		}
		c.mu.Lock()
		ch := c.wait[m.ID]
		delete(c.wait, m.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

// call sends method with params (in session, if not empty) and decodes
// the result into out.
func (c *cdp) call(ctx context.Context, session, method string, params, out any) error {
	c.mu.Lock()
	if c.wait == nil {
		c.mu.Unlock()
		return fmt.Errorf("cdp %s: browser gone", method)
	}
	c.id++
	id := c.id
	ch := make(chan cdpMsg, 1)
	c.wait[id] = ch
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	b, _ := json.Marshal(msg)
	_, err := c.w.Write(append(b, 0))
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cdp %s: %w", method, err)
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("cdp %s: %w", method, ctx.Err())
	case m, ok := <-ch:
		if !ok {
			return fmt.Errorf("cdp %s: browser gone", method)
		}
		if m.Error != nil {
			return fmt.Errorf("cdp %s: %s", method, m.Error.Message)
		}
		if out != nil {
			return json.Unmarshal(m.Result, out)
		}
		return nil
	}
}

// eval evaluates a JavaScript expression in the page and returns its
// value as a string ("" for null or undefined).
func (c *cdp) eval(ctx context.Context, session, expr string) (string, error) {
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
	}
	if err := c.call(ctx, session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r); err != nil {
		return "", err
	}
	if r.Result.Value == nil {
		return "", nil
	}
	return fmt.Sprint(r.Result.Value), nil
}

// startChromium runs headless Chromium with a fresh profile and returns
// its CDP client.
func startChromium(t *testing.T, bin string) *cdp {
	t.Helper()
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--remote-debugging-pipe", "about:blank")
	cmd.ExtraFiles = []*os.File{cmdR, resW}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmdR.Close()
	resW.Close()
	c := &cdp{w: cmdW, wait: map[int]chan cdpMsg{}}
	done := make(chan struct{})
	go func() { defer close(done); c.readLoop(resR) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.call(ctx, "", "Browser.close", map[string]any{}, nil)
		cancel()
		cmdW.Close()
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		resR.Close()
		<-done
	})
	return c
}

// TestDashboardInChromium brings up the emulated demo world with a real
// controller (dashboard on) and a proxy per FEP, loads the dashboard in
// headless Chromium, changes the RTT of a pair three times (World.SetLink)
// and checks that the matrix cell in the page's DOM shows the new value
// within one probe interval + 1 s (median of the three), through the
// dashboard's live stream without a reload. It also checks the first
// render time and writes screenshots when MOSTO_DASHBOARD_SCREENSHOTS is
// set.
func TestDashboardInChromium(t *testing.T) {
	testenv.RequirePrivileged(t)
	chromium := testenv.RequireCommand(t, "chromium")
	if testing.Short() {
		t.Skip("an emulated world and a browser; skipped with -short")
	}
	spec, err := scenario.DemoSpec()
	if err != nil {
		t.Fatal(err)
	}
	w := emutest.Start(t, spec)
	mosto, mostoEnv := clitest.Mosto(t)
	dir := t.TempDir()
	auth := filepath.Join(dir, "ui-auth")
	if err := os.WriteFile(auth, []byte("ops:dashboard-test-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const interval = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sc, err := scenario.Start(ctx, w, scenario.Config{
		Sizes: []int64{30_000, 200_000}, Mosto: mosto, Env: mostoEnv, Dir: dir,
		Controller: &scenario.ControllerConfig{ProbeInterval: interval, Coordinates: true,
			Args: []string{"--ui-listen", "0.0.0.0:7080", "--ui-auth-file", auth, "--ui-poll", "1s"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	// The browser runs outside the world: a reverse proxy on loopback
	// reaches the dashboard from the client host and adds the credentials.
	client := sc.Roles().Client
	uiAddr := net.JoinHostPort(w.Addr(sc.ControllerHost()).String(), "7080")
	target, _ := url.Parse("http://" + uiAddr)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // Server-Sent Events
	rp.Transport = &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return w.Dial(ctx, client, network, uiAddr)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		r.SetBasicAuth("ops", "dashboard-test-pw")
		rp.ServeHTTP(rw, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	page := "http://" + ln.Addr().String() + "/ui/"

	// Without credentials the dashboard refuses.
	if resp, err := (&http.Client{Transport: rp.Transport}).Get("http://" + uiAddr + "/ui/state"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("dashboard without credentials: %d; want 401", resp.StatusCode)
		}
	}

	c := startChromium(t, chromium)
	var tgt struct {
		TargetID string `json:"targetId"`
	}
	if err := c.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &tgt); err != nil {
		t.Fatal(err)
	}
	var att struct {
		SessionID string `json:"sessionId"`
	}
	if err := c.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": tgt.TargetID, "flatten": true}, &att); err != nil {
		t.Fatal(err)
	}
	s := att.SessionID
	if err := c.call(ctx, s, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what, expr string, ok func(string) bool, limit time.Duration) (string, time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			v, err := c.eval(ctx, s, expr)
			if err == nil && ok(v) {
				return v, time.Since(start)
			}
			if time.Since(start) > limit {
				t.Fatalf("%s: not within %v (last %q, %v)", what, limit, v, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	nonEmpty := func(v string) bool { return v != "" }
	// The first render, twice: in a fresh tab (the navigation from
	// about:blank also starts Chromium's renderer process for the site),
	// then navigating the tab to the page again (the renderer is up, as in
	// a browser that is open on the dashboard). Figures (target 500 ms;
	// they include the emulated WAN between the client host and the
	// controller and a loaded machine's scheduling): the test fails only
	// when the page plainly does not work (30 s). The rest of the test
	// runs on the second page.
	for _, tab := range []string{"fresh tab", "open tab"} {
		if err := c.call(ctx, s, "Page.navigate", map[string]any{"url": page}, nil); err != nil {
			t.Fatal(err)
		}
		// The new document: its own navigation entry.
		waitFor("navigation", "String(document.body && document.body.dataset.renders !== undefined && performance.getEntriesByType('navigation').length === 1 && location.href === '"+page+"')", func(v string) bool { return v == "true" }, 30*time.Second)
		first, _ := waitFor("first render", "document.body.dataset.firstRenderMs", nonEmpty, 30*time.Second)
		firstMS, _ := strconv.ParseFloat(first, 64)
		doc, _ := c.eval(ctx, s, "Math.round(performance.getEntriesByType('navigation')[0].responseEnd)")
		js, _ := c.eval(ctx, s, "document.body.dataset.renderMs")
		from, _ := c.eval(ctx, s, "document.body.dataset.firstFrom || 'stream'")
		// What the first render waited for: the request (responseStart:
		// the first byte of the page), the document's commit in the
		// renderer (domInteractive: the HTML parsed, the inline script
		// run), the first contentful paint.
		steps, _ := c.eval(ctx, s, "(() => { const n = performance.getEntriesByType('navigation')[0], p = performance.getEntriesByType('paint').find((e) => e.name === 'first-contentful-paint'); return 'first byte ' + Math.round(n.responseStart) + ' ms, DOM interactive ' + Math.round(n.domInteractive) + ' ms, first contentful paint ' + (p ? Math.round(p.startTime) + ' ms' : 'not yet'); })()")
		t.Logf("%s: first render %.0f ms after navigation start, from the %s state (HTML received at %s ms; one render takes %s ms of JavaScript; %s)", tab, firstMS, from, doc, js, steps)
		if firstMS > 30000 {
			t.Errorf("%s: first render after %.0f ms", tab, firstMS)
		}
		if tab == "fresh tab" {
			// Mark the document so the next one is told apart.
			c.eval(ctx, s, "document.body.dataset.renders = undefined; delete document.body.dataset.renders; 'x'")
		}
	}
	if store, _ := c.eval(ctx, s, "document.getElementById('c-store').textContent"); store != "bbolt" {
		t.Errorf("store shown %q; want bbolt (the demo controller's)", store)
	}
	weight, _ := c.eval(ctx, s, "performance.getEntriesByType('resource').concat(performance.getEntriesByType('navigation')).filter(e => !e.name.endsWith('/events')).reduce((a, e) => a + e.transferSize, 0)")
	t.Logf("page weight as transferred: %s bytes", weight)

	// A pair measured by both ends, not the controller's host.
	mx, err := sc.API().Matrix(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var a, b string
	for i, x := range mx.Names {
		for j, y := range mx.Names {
			if a == "" && i < j && mx.RTTMS[i][j] != nil && mx.RTTMS[j][i] != nil {
				a, b = x, y
			}
		}
	}
	if a == "" {
		t.Fatal("no measured pair in the matrix")
	}
	cell := fmt.Sprintf("(document.getElementById(%q) || {dataset: {}}).dataset.ms || ''", "rtt:"+a+">"+b)
	waitFor("the pair's cell", cell, nonEmpty, 30*time.Second)
	if dir := os.Getenv(screenshotsEnv); dir != "" {
		shot(t, ctx, c, s, filepath.Join(dir, "dashboard.png"))
	}
	base, err := w.Link(a, b)
	if err != nil {
		t.Fatal(err)
	}
	var lags []float64
	for k := range 3 {
		l := base
		if k%2 == 0 {
			l.DelayMS = base.DelayMS*2 + 20
		}
		renders, _ := c.eval(ctx, s, "document.body.dataset.renders")
		if err := w.SetLink(a, b, l); err != nil {
			t.Fatal(err)
		}
		want := float64(w.RTT(a, b)) / 1e6
		got, took := waitFor(fmt.Sprintf("change %d: %s>%s = %.1f ms in the DOM", k+1, a, b, want), cell, func(v string) bool {
			ms, err := strconv.ParseFloat(v, 64)
			return err == nil && math.Abs(ms-want) <= max(0.15*want, 3)
		}, 30*time.Second)
		after, _ := c.eval(ctx, s, "document.body.dataset.renders")
		t.Logf("change %d: %s-%s RTT -> %.1f ms; the page showed %s ms after %v (renders %s -> %s, no reload)",
			k+1, a, b, want, got, took.Round(time.Millisecond), renders, after)
		if n0, _ := strconv.Atoi(renders); n0 == 0 {
			t.Errorf("change %d: page not rendered before the change", k+1)
		}
		lags = append(lags, took.Seconds())
		if k == 0 {
			if dir := os.Getenv(screenshotsEnv); dir != "" {
				c.eval(ctx, s, fmt.Sprintf("document.getElementById(%q).click()", "rtt:"+a+">"+b))
				time.Sleep(200 * time.Millisecond) // let the history render for the picture
				shot(t, ctx, c, s, filepath.Join(dir, "dashboard-change.png"))
			}
		}
	}
	// The page was loaded once: a reload would have reset the counter.
	if nav, _ := c.eval(ctx, s, "performance.getEntriesByType('navigation').length"); nav != "1" {
		t.Errorf("navigations %s; want 1", nav)
	}
	slices.Sort(lags)
	med := stats.Median(lags)
	limit := (interval + time.Second).Seconds()
	t.Logf("SetLink -> new value in the DOM: median %.2f s, max %.2f s over %d changes (limit: probe interval %v + 1 s)", med, lags[len(lags)-1], len(lags), interval)
	if med > limit {
		t.Errorf("median time to the new RTT in the DOM %.2f s > probe interval + 1 s (%.1f s)", med, limit)
	}
}

// shot writes a PNG screenshot of the whole page.
func shot(t *testing.T, ctx context.Context, c *cdp, s, path string) {
	t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	if err := c.call(ctx, s, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &r); err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	b, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	t.Logf("screenshot %s (%d bytes)", path, len(b))
}
