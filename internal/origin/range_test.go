package origin

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

func TestBodyAt(t *testing.T) {
	full, _ := io.ReadAll(Body(5, 1000))
	for _, c := range [][2]int64{{0, 1000}, {1, 10}, {7, 9}, {8, 8}, {999, 1}, {13, 500}, {500, 0}} {
		got, _ := io.ReadAll(BodyAt(5, c[0], c[1]))
		if !bytes.Equal(got, full[c[0]:c[0]+c[1]]) {
			t.Errorf("BodyAt(5, %d, %d) differs from the stream's bytes", c[0], c[1])
		}
	}
}

func TestParseRange(t *testing.T) {
	tests := []struct {
		v       string
		size    int64
		off, n  int64
		wantErr error
	}{
		{"bytes=0-99", 1000, 0, 100, nil},
		{"bytes=100-", 1000, 100, 900, nil},
		{"bytes=-100", 1000, 900, 100, nil},
		{"bytes=-5000", 1000, 0, 1000, nil},
		{"bytes=990-5000", 1000, 990, 10, nil},
		{" Bytes = 5-5 ", 1000, 5, 1, nil},
		{"bytes=1000-", 1000, 0, 0, errUnsatisfiable},
		{"bytes=-0", 1000, 0, 0, errUnsatisfiable},
		{"bytes=0-", 0, 0, 0, errUnsatisfiable},
		{"bytes=0-1,5-6", 1000, 0, 0, errNoRange},
		{"bytes=5-1", 1000, 0, 0, errNoRange},
		{"items=0-1", 1000, 0, 0, errNoRange},
		{"bytes=+1-2", 1000, 0, 0, errNoRange},
		{"bytes=a-b", 1000, 0, 0, errNoRange},
		{"bytes=", 1000, 0, 0, errNoRange},
		{"bytes=99999999999999999999-", 1000, 0, 0, errNoRange},
	}
	for _, tc := range tests {
		off, n, err := parseRange(tc.v, tc.size)
		if err != tc.wantErr || (err == nil && (off != tc.off || n != tc.n)) {
			t.Errorf("parseRange(%q, %d) = %d, %d, %v; want %d, %d, %v", tc.v, tc.size, off, n, err, tc.off, tc.n, tc.wantErr)
		}
	}
}

func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"bytes=0-99", "bytes=-5", "bytes=7-", "bytes=1-2,3-4", "x"} {
		f.Add(s, int64(1000))
	}
	f.Fuzz(func(t *testing.T, v string, size int64) {
		if size < 0 {
			size = -size
		}
		if size < 0 {
			return
		}
		off, n, err := parseRange(v, size)
		if err != nil {
			return
		}
		if off < 0 || n <= 0 || off+n > size {
			t.Fatalf("parseRange(%q, %d) = %d, %d: outside the object", v, size, off, n)
		}
	})
}

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestServerRange(t *testing.T) {
	testenv.CheckLeaks(t)
	_, base := startServer(t, Config{Seed: 3})
	url := base + "/obj?size=100000"
	full, _ := io.ReadAll(Body(3, 100000))
	resp, body := get(t, url, nil)
	etag, lm := resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")
	if resp.StatusCode != 200 || etag != ETag(3, 100000) || lm != DefaultModified.Format(http.TimeFormat) || resp.Header.Get("Accept-Ranges") != "bytes" || !bytes.Equal(body, full) {
		t.Fatalf("full GET: status %d, ETag %q, Last-Modified %q, Accept-Ranges %q, %d bytes", resp.StatusCode, etag, lm, resp.Header.Get("Accept-Ranges"), len(body))
	}
	tests := []struct {
		name   string
		hdr    map[string]string
		status int
		cr     string
		off, n int
	}{
		{"middle", map[string]string{"Range": "bytes=1000-1999"}, 206, "bytes 1000-1999/100000", 1000, 1000},
		{"open", map[string]string{"Range": "bytes=99990-"}, 206, "bytes 99990-99999/100000", 99990, 10},
		{"suffix", map[string]string{"Range": "bytes=-3"}, 206, "bytes 99997-99999/100000", 99997, 3},
		{"beyond", map[string]string{"Range": "bytes=100000-"}, 416, "bytes */100000", 0, 0},
		{"multi", map[string]string{"Range": "bytes=0-1,4-5"}, 200, "", 0, 100000},
		{"if-range etag", map[string]string{"Range": "bytes=5-9", "If-Range": etag}, 206, "bytes 5-9/100000", 5, 5},
		{"if-range date", map[string]string{"Range": "bytes=5-9", "If-Range": lm}, 206, "bytes 5-9/100000", 5, 5},
		{"if-range other", map[string]string{"Range": "bytes=5-9", "If-Range": `"other"`}, 200, "", 0, 100000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, url, tc.hdr)
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Range") != tc.cr {
				t.Fatalf("status %d, Content-Range %q; want %d, %q", resp.StatusCode, resp.Header.Get("Content-Range"), tc.status, tc.cr)
			}
			if tc.status == 416 {
				return
			}
			if !bytes.Equal(body, full[tc.off:tc.off+tc.n]) {
				t.Errorf("body of %d bytes is not bytes [%d, %d) of the object", len(body), tc.off, tc.off+tc.n)
			}
		})
	}
}

func TestServerSilenceAndRate(t *testing.T) {
	testenv.CheckLeaks(t)
	s, base := startServer(t, Config{Rate: 2 << 20})
	start := time.Now()
	_, body := get(t, base+"/obj?size=524288", nil)
	if d := time.Since(start); len(body) != 524288 || d < 200*time.Millisecond {
		t.Errorf("512 KiB at 2 MiB/s took %v (%d bytes); want >= 200ms (250ms less a chunk of burst)", d, len(body))
	}
	s.SetRate(0)
	s.Silence(300 * time.Millisecond)
	start = time.Now()
	_, body = get(t, base+"/obj?size=1000", nil)
	if d := time.Since(start); len(body) != 1000 || d < 250*time.Millisecond {
		t.Errorf("request during a 300ms silence answered after %v; want >= 250ms", d)
	}
	s.Silence(0)
	start = time.Now()
	get(t, base+"/obj?size=1000", nil)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("after Silence(0) a request took %v", d)
	}
}
