package dashboard

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

//go:embed assets
var assets embed.FS

// Source is what the dashboard reads; *controller.Controller implements it.
type Source interface {
	FEPs(ctx context.Context) ([]api.FEP, error)
	Matrix(ctx context.Context) (api.Matrix, error)
	Health(ctx context.Context) api.Health
	Destinations(ctx context.Context) ([]api.DestinationStatus, error)
	// Tables returns the newest table of every LoP.
	Tables() map[string]*api.EncodedTable
	// FEPStates returns the last report of every FEP that reported.
	FEPStates() map[string]api.FEPState
	// KeysRotated returns when the current hop key was made.
	KeysRotated(ctx context.Context) (time.Time, error)
	// Changed returns a channel closed at the next report.
	Changed() <-chan struct{}
}

// Config configures a Dashboard.
type Config struct {
	Source Source
	// Poll is the period of a rebuild when no report arrives; 0 means 1s.
	Poll time.Duration
	// MinGap is the shortest time between two rebuilds caused by reports
	// (a burst of reports costs one rebuild); 0 means 100ms.
	MinGap time.Duration
	// DownAfter: a FEP that did not report for longer is shown down; 0
	// means 30s (proxies push their counters every 5s).
	DownAfter time.Duration
	// Store names the controller's store kind ("bbolt", "etcd"), shown
	// beside the leader.
	Store string
	Log   *slog.Logger
	Now   func() time.Time // nil: time.Now
}

// Dashboard keeps the current State and serves it.
type Dashboard struct {
	cfg  Config
	log  *slog.Logger
	tr   *tracker
	page *page

	mu    sync.Mutex
	state *State
	body  []byte        // state as JSON
	next  chan struct{} // closed and replaced when state changes
}

// New returns a Dashboard; call Run to keep its state current.
func New(cfg Config) (*Dashboard, error) {
	if cfg.Source == nil {
		return nil, errors.New("dashboard: no source")
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.MinGap <= 0 {
		cfg.MinGap = 100 * time.Millisecond
	}
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pg, err := buildPage()
	if err != nil {
		return nil, err
	}
	return &Dashboard{cfg: cfg, log: cfg.Log, tr: newTracker(), page: pg, next: make(chan struct{})}, nil
}

// Run rebuilds the state every Poll and after reports until ctx ends.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	for {
		changed := d.cfg.Source.Changed()
		d.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
			// Coalesce a burst of reports into one rebuild.
			gap := time.NewTimer(d.cfg.MinGap)
			select {
			case <-ctx.Done():
				gap.Stop()
				return
			case <-gap.C:
			}
		}
	}
}

// refresh rebuilds the state and publishes it when its content changed.
func (d *Dashboard) refresh(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := d.tr.build(bctx, d.cfg.Source, d.cfg.Now(), d.cfg.DownAfter)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("dashboard: cannot read the controller state", "err", err)
		}
		return
	}
	st.Controller.Store = d.cfg.Store
	body, err := json.Marshal(st)
	if err != nil {
		d.log.Warn("dashboard: encode state", "err", err)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	same := sameContent(d.state, st)
	d.state, d.body = st, body
	if !same {
		close(d.next)
		d.next = make(chan struct{})
	}
}

// State returns the current state (nil before the first rebuild).
func (d *Dashboard) State() *State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state
}

func (d *Dashboard) current() ([]byte, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.body, d.next
}

// Handler serves the page and its data under /ui/: / (redirect), /ui/
// (the page and its assets), /ui/state, /ui/events, /ui/table/{lop}. Only
// GET and HEAD.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(sub)
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", withHeaders(files)))
	mux.HandleFunc("GET /ui/{$}", d.servePage)
	mux.HandleFunc("GET /ui/state", d.serveState)
	mux.HandleFunc("GET /ui/events", d.serveEvents)
	mux.HandleFunc("GET /ui/table/{lop}", d.serveTable)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/", http.StatusFound)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "read-only dashboard: method "+r.Method+" not allowed", http.StatusMethodNotAllowed)
			return
		}
		http.NotFound(w, r)
	})
	return mux
}

// page is the dashboard page with its style and script inlined, so the
// first render needs one request: the current state rides in the page
// (a JSON data block the script renders at once), the live stream
// (/ui/events) follows. The policy allows exactly these inline blocks by
// their hashes.
type page struct {
	head, tail []byte // the page around the state
	csp        string
}

// pageMarker is where the state goes (before the inlined script).
const pageMarker = "</body>"

func buildPage() (*page, error) {
	read := func(n string) (string, error) {
		b, err := assets.ReadFile("assets/" + n)
		return string(b), err
	}
	html, err := read("index.html")
	if err != nil {
		return nil, err
	}
	css, err := read("style.css")
	if err != nil {
		return nil, err
	}
	js, err := read("app.js")
	if err != nil {
		return nil, err
	}
	const link, script = `<link rel="stylesheet" href="style.css">`, `<script src="app.js" defer></script>`
	if !strings.Contains(html, link) || !strings.Contains(html, script) || !strings.Contains(html, pageMarker) {
		return nil, errors.New("dashboard: index.html lacks the style link, the script or </body>")
	}
	html = strings.Replace(html, link, "<style>"+css+"</style>", 1)
	html = strings.Replace(html, script, "", 1)
	i := strings.LastIndex(html, pageMarker)
	hash := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return "'sha256-" + base64.StdEncoding.EncodeToString(h[:]) + "'"
	}
	return &page{
		head: []byte(html[:i] + `<script type="application/json" id="state0">`),
		tail: []byte("</script>\n<script>" + js + "</script>\n" + html[i:]),
		csp: "default-src 'self'; img-src 'self' data:; style-src 'self' " + hash(css) + "; script-src 'self' " + hash(js) +
			"; connect-src 'self'; frame-ancestors 'none'",
	}, nil
}

// servePage answers /ui/: the page with the current state (null before
// the first one; the script then waits for the stream).
func (d *Dashboard) servePage(w http.ResponseWriter, r *http.Request) {
	body, _ := d.current()
	if body == nil {
		body = []byte("null")
	}
	w.Header().Set("Content-Security-Policy", d.page.csp)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(d.page.head)+len(body)+len(d.page.tail)))
	if r.Method == http.MethodHead {
		return
	}
	w.Write(d.page.head)
	w.Write(body) // JSON from encoding/json: <, > and & are escaped
	w.Write(d.page.tail)
}

// withHeaders adds the security headers of the page: scripts and styles
// only from this origin.
func withHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

func (d *Dashboard) serveState(w http.ResponseWriter, r *http.Request) {
	body, _ := d.current()
	if body == nil {
		http.Error(w, "dashboard: no state yet", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(body)
}

// serveEvents streams the state: one "state" event at once, then one at
// every change, and a comment every 15 s to keep proxies from timing out.
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	var sent []byte
	for {
		body, next := d.current()
		if body != nil && &body[0] != firstByte(sent) {
			if _, err := fmt.Fprintf(w, "event: state\ndata: %s\n\n", body); err != nil {
				return
			}
			sent = body
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-next:
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
		}
	}
}

func firstByte(b []byte) *byte {
	if len(b) == 0 {
		return nil
	}
	return &b[0]
}

// serveTable answers the current table of one LoP (api.Table JSON).
func (d *Dashboard) serveTable(w http.ResponseWriter, r *http.Request) {
	lop := r.PathValue("lop")
	if err := api.ValidateID(lop); err != nil {
		http.Error(w, "lop: "+err.Error(), http.StatusBadRequest)
		return
	}
	t := d.cfg.Source.Tables()[lop]
	if t == nil {
		http.Error(w, "no table for lop "+lop, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(t.JSON())
}
