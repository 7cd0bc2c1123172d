package mget

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
)

// recorder serves h and records every request's Range (with " if-range"
// appended when the request carries one). When hold is set, requests wait
// for it (or their end) before h answers.
type recorder struct {
	h     http.Handler
	hold  <-chan struct{}
	asked chan struct{} // closed at the first request
	once  sync.Once
	onReq func(n int) // when set, called with the count of requests so far

	mu   sync.Mutex
	reqs []string
}

func newRecorder(h http.Handler, hold <-chan struct{}) *recorder {
	return &recorder{h: h, hold: hold, asked: make(chan struct{})}
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v := r.Header.Get("Range")
	if r.Header.Get("If-Range") != "" {
		v += " if-range"
	}
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, v)
	n := len(rc.reqs)
	rc.mu.Unlock()
	if rc.onReq != nil {
		rc.onReq(n)
	}
	rc.once.Do(func() { close(rc.asked) })
	if rc.hold != nil {
		select {
		case <-rc.hold:
		case <-r.Context().Done():
			return
		}
	}
	rc.h.ServeHTTP(w, r)
}

func (rc *recorder) requests() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.reqs...)
}

// closeWhenAsked closes ch once every recorder has seen a request (or
// never, if the test ends first).
func closeWhenAsked(t *testing.T, ch chan struct{}, rcs ...*recorder) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for _, rc := range rcs {
			select {
			case <-rc.asked:
			case <-ctx.Done():
				return
			}
		}
		close(ch)
	}()
}

// firstRangeWorld runs n origins of the object seed 77 (rate capped at
// rate B/s each, 0: none) behind recorders; source 0's answers wait until
// every source has been asked, so that every sub-flow sends its first
// request before the reference identity is known (the first-range path).
func firstRangeWorld(t *testing.T, n int, rate int64) ([]*recorder, []string) {
	t.Helper()
	rcs := make([]*recorder, n)
	urls := make([]string, n)
	hold := make(chan struct{})
	for k := range rcs {
		var h <-chan struct{}
		if k == 0 {
			h = hold
		}
		rcs[k] = newRecorder(origin.New(origin.Config{Seed: 77, Rate: rate}, nil), h)
		urls[k] = serve(t, rcs[k])
	}
	closeWhenAsked(t, hold, rcs...)
	return rcs, urls
}

// TestGetFirstRange: no one-byte probe before the first range. Every
// sub-flow's first request is its own block (sub-flow k: block k) without
// If-Range, sent before any answer; the first source's later requests all
// carry If-Range (its identity was seen); the file is correct.
func TestGetFirstRange(t *testing.T) {
	const size, block = 3 << 20, 64 << 10
	rcs, urls := firstRangeWorld(t, 3, 4<<20)
	obj := fmt.Sprintf("/obj?size=%d", size)
	out := filepath.Join(t.TempDir(), "f")
	sum := origin.Sum(77, size)
	st, err := Get(context.Background(), Config{Sources: sources(urls[0]+obj, urls[1]+obj, urls[2]+obj), Out: out, Block: block, SHA256: sum[:]})
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, size)
	for k, rc := range rcs {
		reqs := rc.requests()
		want := fmt.Sprintf("bytes=%d-%d", k*block, (k+1)*block-1)
		if len(reqs) == 0 || reqs[0] != want {
			t.Errorf("source %d: first request %q; want %q (its own block, no If-Range)", k, reqs, want)
			continue
		}
		if st.Subflows[k].Errors == 0 {
			for _, r := range reqs {
				if strings.HasPrefix(r, "bytes=0-0") {
					t.Errorf("source %d: a one-byte probe in a download without errors: %q", k, reqs)
					break
				}
			}
		}
		if k == 0 {
			for j, r := range reqs[1:] {
				if !strings.HasSuffix(r, " if-range") {
					t.Errorf("source 0: request %d (%q) after the identity was seen has no If-Range", j+1, r)
				}
			}
		}
		if st.Subflows[k].Bytes == 0 {
			t.Errorf("source %d carried nothing: %+v", k, st.Subflows[k])
		}
	}
}

// TestGetFirstRangeBeyondObject: an object shorter than the sub-flows'
// first blocks. Sub-flow 2's first range lies beyond it (416): it gives the
// block up, asks for the identity with the one-byte probe and is not
// dropped. An empty object: the first range of every sub-flow is 416, the
// reference's identity comes from its probe.
func TestGetFirstRangeBeyondObject(t *testing.T) {
	const block = 64 << 10
	for _, size := range []int64{block + 100, 0} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			// Source 0 (the reference) answers only once source 2 has
			// been asked twice: its first range, then the probe.
			hold := make(chan struct{})
			var once sync.Once
			rcs := []*recorder{newRecorder(origin.New(origin.Config{Seed: 77}, nil), hold), newRecorder(origin.New(origin.Config{Seed: 77}, nil), nil), newRecorder(origin.New(origin.Config{Seed: 77}, nil), nil)}
			rcs[2].onReq = func(n int) {
				if n == 2 {
					once.Do(func() { close(hold) })
				}
			}
			var urls []string
			for _, rc := range rcs {
				urls = append(urls, serve(t, rc))
			}
			obj := fmt.Sprintf("/obj?size=%d", size)
			out := filepath.Join(t.TempDir(), "f")
			sum := origin.Sum(77, size)
			st, err := Get(context.Background(), Config{Sources: sources(urls[0]+obj, urls[1]+obj, urls[2]+obj), Out: out, Block: block, SHA256: sum[:]})
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, out, size)
			for k, s := range st.Subflows {
				if s.Disabled != "" {
					t.Errorf("source %d dropped: %+v", k, s)
				}
			}
			ks := []int{2}
			if size == 0 {
				ks = append(ks, 0) // the reference's first range is beyond it too
			}
			for _, k := range ks {
				reqs := rcs[k].requests()
				if len(reqs) < 2 || reqs[0] != fmt.Sprintf("bytes=%d-%d", k*block, (k+1)*block-1) || reqs[1] != "bytes=0-0" {
					t.Errorf("source %d's requests %q; want its block beyond the object, then the one-byte probe", k, reqs)
				}
			}
		})
	}
}

// TestGetBadFirstResponse: a source whose first response (a real range
// now, no probe before it) breaks the range protocol, or is another
// version: the source is dropped (or, truncated, retried) and no byte of a
// bad response is written; the good mirror completes a correct file. With
// the bad source first (the one that would define the object) and second.
func TestGetBadFirstResponse(t *testing.T) {
	const size = 1 << 20
	obj := fmt.Sprintf("/obj?size=%d", size)
	// every: the handler misbehaves from the first request on; only the
	// one-byte probe of a retry is answered well (bad() answers every
	// request from byte 0 well: a good first answer).
	every := func(kind string) http.Handler {
		return badHandler(kind, func(off, last int64) bool { return off == 0 && last == 0 })
	}
	kinds := []string{"200", "shifted", "garbage", "truncated", "total", "etag", "length"}
	for _, pos := range []int{0, 1} {
		for _, kind := range kinds {
			if pos == 0 && (kind == "total" || kind == "etag" || kind == "length") {
				// A consistent other version at the first position defines
				// the object (the first mirror to answer does): the good
				// mirror is the one refused; TestGetMirrorDisagrees has it.
				continue
			}
			t.Run(fmt.Sprintf("%s at %d", kind, pos), func(t *testing.T) {
				_, good := startOrigin(t, 4<<20)
				var badURL string
				switch kind {
				case "etag":
					badURL = good + fmt.Sprintf("/obj?size=%d&seed=5", size)
				case "length":
					badURL = good + fmt.Sprintf("/obj?size=%d", size+1)
				default:
					badURL = serve(t, every(kind)) + "/obj"
				}
				srcs := sources(good+obj, badURL)
				if pos == 0 {
					srcs = sources(badURL, good+obj)
				}
				out := filepath.Join(t.TempDir(), "f")
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				st, err := Get(ctx, Config{Sources: srcs, Out: out, Block: 32 << 10, Stall: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				checkFile(t, out, size)
				b := st.Subflows[pos]
				if kind == "truncated" {
					if b.Errors == 0 {
						t.Errorf("truncated responses not seen as errors: %+v", b)
					}
					return
				}
				if b.Disabled == "" || b.Bytes+b.DupBytes != 0 {
					t.Errorf("bad first response (%s) not refused, or its bytes written: %+v", kind, b)
				}
			})
		}
	}
}

// TestGetLateMirrorDisagrees: a mirror of another version whose first
// range (block 1) was asked before the object was known, and whose first
// response comes only after the reference mirror has written data (its
// answers wait for the first progress report with bytes received): it is
// refused, none of its bytes is written, and block 1, which its first
// range held, goes to the good mirror; the file is correct.
func TestGetLateMirrorDisagrees(t *testing.T) {
	const size = 4 << 20
	for _, kind := range []string{"etag", "length"} {
		t.Run(kind, func(t *testing.T) {
			// The good mirror answers once the late one has been asked (so
			// the late one's first range goes out before the object is
			// known: the first-range path); the late one answers once the
			// good one's bytes are written.
			asked, wrote := make(chan struct{}), make(chan struct{})
			var once sync.Once
			lateRec := newRecorder(origin.New(origin.Config{Seed: 77}, nil), wrote)
			closeWhenAsked(t, asked, lateRec)
			good := serve(t, newRecorder(origin.New(origin.Config{Seed: 77, Rate: 2 << 20}, nil), asked)) // about 2 s: the late answer comes well before the end
			late := serve(t, lateRec)
			badURL := late + fmt.Sprintf("/obj?size=%d&seed=5", size)
			if kind == "length" {
				badURL = late + fmt.Sprintf("/obj?size=%d", size-1)
			}
			out := filepath.Join(t.TempDir(), "f")
			sum := origin.Sum(77, size)
			var atGate int64
			cfg := Config{Sources: sources(good+fmt.Sprintf("/obj?size=%d", size), badURL), Out: out, Block: 64 << 10, SHA256: sum[:]}
			cfg.Progress = func(s Snapshot) {
				if s.Received > 0 {
					once.Do(func() { atGate = s.Received; close(wrote) })
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			st, err := Get(ctx, cfg)
			once.Do(func() { close(wrote) })
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, out, size)
			if atGate == 0 {
				t.Fatalf("the late mirror was released before any byte was written")
			}
			b := st.Subflows[1]
			if r := lateRec.requests(); len(r) == 0 || r[0] != fmt.Sprintf("bytes=%d-%d", 64<<10, 128<<10-1) {
				t.Errorf("late mirror's requests %q; want its first range (block 1) first", r)
			}
			if !strings.Contains(b.Disabled, "mirror disagrees") || b.Bytes+b.DupBytes != 0 {
				t.Errorf("late mirror of another version (%s) not refused, or its bytes written (released at %d bytes received): %+v", kind, atGate, b)
			}
		})
	}
}
