package mget

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
)

// FuzzResponse feeds raw bytes as the answer to a request for bytes
// [1000, 2000) of a 5000-byte object: checkPart must reject or accept
// without panicking, and an accepted answer must carry bytes starting at
// 1000, inside the asked range, of an object of the reference length.
func FuzzResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 1000-1999/5000\r\nContent-Length: 1000\r\n\r\n",
		"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 1000-1499/5000\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n",
		"HTTP/1.1 206 x\r\nContent-Range: bytes 1000-1999/*\r\n\r\n",
		"HTTP/1.1 416 x\r\nContent-Range: bytes */5000\r\n\r\n",
		"HTTP/1.1 206 x\r\nContent-Range: bytes 1000-1999/5000\r\nETag: \"a\"\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	ref := Identity{Size: 5000, ETag: `"a"`}
	f.Fuzz(func(t *testing.T, raw []byte) {
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(raw))), nil)
		if err != nil {
			return
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		upto, got, err := checkPart(resp.StatusCode, resp.Header, 1000, 2000, ref)
		if err != nil {
			return
		}
		if resp.StatusCode != 206 || upto <= 1000 || upto > 2000 || got.Size != 5000 {
			t.Fatalf("accepted status %d, upto %d, identity %+v", resp.StatusCode, upto, got)
		}
		if strong(got.ETag) && got.ETag != ref.ETag {
			t.Fatalf("accepted ETag %s for reference %s", got.ETag, ref.ETag)
		}
	})
}

func FuzzContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-0/1", "bytes 5-9/10", "bytes */10", "bytes 9-5/10", "bytes 1-2/2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		a, b, n, err := parseContentRange(v)
		if err == nil && (a < 0 || b < a || b >= n) {
			t.Fatalf("parseContentRange(%q) = %d, %d, %d", v, a, b, n)
		}
	})
}
