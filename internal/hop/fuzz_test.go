package hop

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// FuzzRead checks that Read never panics, never reads past the announced
// header, types every refusal, and that whatever it accepts re-marshals to
// the same bytes.
func FuzzRead(f *testing.F) {
	kr := testKeyring(f)
	good := mustMarshal(f, sampleHeader(), kr)
	f.Add(good)
	f.Add(good[:40])
	f.Add(AppendPlainV2(nil, sampleHeader().Source, sampleHeader().Dest))
	f.Add([]byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"))
	f.Add(append(append([]byte(nil), good...), "trailing payload"...))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		h, err := Read(r, kr, t0, time.Minute)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrExpired) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		used := len(data) - r.Len()
		again, err := h.Marshal(kr)
		if err != nil {
			t.Fatalf("accepted header does not marshal: %v", err)
		}
		// Only a canonical encoding can carry a valid MAC unless the
		// fuzzer found an HMAC collision, so the bytes must match modulo
		// non-critical TLVs, which Marshal does not write.
		if len(again) == used && !bytes.Equal(again, data[:used]) {
			t.Fatalf("accepted %x; re-marshals to %x", data[:used], again)
		}
	})
}
