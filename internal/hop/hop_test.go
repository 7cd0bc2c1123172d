package hop

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

var t0 = time.Date(2026, 11, 22, 2, 0, 0, 0, time.UTC)

func testKeyring(t testing.TB) *Keyring {
	t.Helper()
	kr, err := NewKeyring(Key{ID: 7, Secret: []byte("0123456789abcdef0123456789abcdef")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func sampleHeader() *Header {
	return &Header{
		Source: netip.MustParseAddrPort("192.0.2.10:40000"),
		Dest:   netip.MustParseAddrPort("198.51.100.7:443"),
		Route:  []string{"fep-a", "fep-b", "fep-c"},
		Hop:    1,
		Target: "origin.example:443",
		Size:   1 << 20,
		FlowID: [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		Time:   t0,
	}
}

func mustMarshal(t testing.TB, h *Header, kr *Keyring) []byte {
	t.Helper()
	b, err := h.Marshal(kr)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	return b
}

func equalHeader(a, b *Header) bool {
	return a.Source == b.Source && a.Dest == b.Dest && reflect.DeepEqual(a.Route, b.Route) &&
		a.Hop == b.Hop && a.Target == b.Target && a.Size == b.Size && a.FlowID == b.FlowID && a.Time.Equal(b.Time) &&
		a.Lookup == b.Lookup && a.Verdict == b.Verdict
}

func TestRoundTrip(t *testing.T) {
	kr := testKeyring(t)
	mod := func(f func(h *Header)) *Header { h := sampleHeader(); f(h); return h }
	tests := []struct {
		name string
		h    *Header
	}{
		{"ipv4", sampleHeader()},
		{"ipv6", mod(func(h *Header) {
			h.Source = netip.MustParseAddrPort("[2001:db8::1]:5555")
			h.Dest = netip.MustParseAddrPort("[2001:db8::2]:80")
		})},
		{"mixed families", mod(func(h *Header) { h.Dest = netip.MustParseAddrPort("[2001:db8::2]:80") })},
		{"no addresses", mod(func(h *Header) { h.Source, h.Dest = netip.AddrPort{}, netip.AddrPort{} })},
		{"two-id route", mod(func(h *Header) { h.Route = []string{"inp", "egp"}; h.Hop = 1 })},
		{"verdict asked", mod(func(h *Header) { h.Verdict = true })},
		{"max route", mod(func(h *Header) {
			h.Route = nil
			for i := 0; i < MaxRoute; i++ {
				h.Route = append(h.Route, strings.Repeat(string(rune('a'+i)), MaxIDLen))
			}
			h.Hop = MaxRoute - 1
		})},
		{"ipv6 target", mod(func(h *Header) { h.Target = "[2001:db8::5]:8443" })},
		{"zero size", mod(func(h *Header) { h.Size = 0 })},
		{"long target", mod(func(h *Header) { h.Target = strings.Repeat("x", MaxTargetLen-6) + ":65535" })},
		{"lookup request", mod(func(h *Header) { h.Route = []string{"edge", "lop"}; h.Hop = 1; h.Lookup = "fep-c" })},
		{"lookup of max id", mod(func(h *Header) { h.Hop = 2; h.Lookup = strings.Repeat("z", MaxIDLen) })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustMarshal(t, tt.h, kr)
			r := bytes.NewReader(append(append([]byte(nil), b...), "payload"...))
			got, err := Read(r, kr, t0.Add(time.Second), time.Minute)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if !equalHeader(got, tt.h) {
				t.Errorf("Read = %+v; want %+v", got, tt.h)
			}
			rest, _ := io.ReadAll(r)
			if string(rest) != "payload" {
				t.Errorf("Read left %q; want the payload untouched", rest)
			}
		})
	}
}

func TestMarshalRefuses(t *testing.T) {
	kr := testKeyring(t)
	tests := []struct {
		name string
		mod  func(h *Header)
	}{
		{"empty route", func(h *Header) { h.Route = nil }},
		{"too many ids", func(h *Header) { h.Route = make([]string, MaxRoute+1); h.Hop = 0 }},
		{"empty id", func(h *Header) { h.Route[1] = "" }},
		{"long id", func(h *Header) { h.Route[1] = strings.Repeat("a", MaxIDLen+1) }},
		{"space in id", func(h *Header) { h.Route[1] = "a b" }},
		{"control in id", func(h *Header) { h.Route[1] = "a\x00" }},
		{"non-ascii id", func(h *Header) { h.Route[1] = "fép" }},
		{"hop past end", func(h *Header) { h.Hop = 3 }},
		{"negative hop", func(h *Header) { h.Hop = -1 }},
		{"no port", func(h *Header) { h.Target = "origin.example" }},
		{"port zero", func(h *Header) { h.Target = "origin.example:0" }},
		{"port too big", func(h *Header) { h.Target = "origin.example:65536" }},
		{"empty host", func(h *Header) { h.Target = ":80" }},
		{"space in target", func(h *Header) { h.Target = "a b:80" }},
		{"long target", func(h *Header) { h.Target = strings.Repeat("x", MaxTargetLen) + ":1" }},
		{"negative size", func(h *Header) { h.Size = -1 }},
		{"zero time", func(h *Header) { h.Time = time.Time{} }},
		{"time before 1970", func(h *Header) { h.Time = time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"time after 2262", func(h *Header) { h.Time = time.Date(2263, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"lookup not at the route's end", func(h *Header) { h.Lookup = "fep-c" }},
		{"lookup id with space", func(h *Header) { h.Hop = 2; h.Lookup = "a b" }},
		{"long lookup id", func(h *Header) { h.Hop = 2; h.Lookup = strings.Repeat("a", MaxIDLen+1) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := sampleHeader()
			tt.mod(h)
			if b, err := h.Marshal(kr); err == nil {
				t.Errorf("Marshal(%+v) = %x, nil; want an error", h, b)
			}
		})
	}
	if _, err := sampleHeader().Marshal(nil); err == nil {
		t.Error("Marshal(nil keyring) succeeded")
	}
}

func TestEveryByteFlipRefused(t *testing.T) {
	kr := testKeyring(t)
	b := mustMarshal(t, sampleHeader(), kr)
	for i := range b {
		for _, mask := range []byte{0x01, 0x80, 0xFF} {
			c := append([]byte(nil), b...)
			c[i] ^= mask
			h, err := Read(bytes.NewReader(c), kr, t0, time.Minute)
			if err == nil {
				t.Fatalf("byte %d ^ 0x%02x: Read = %+v, nil; want refusal", i, mask, h)
			}
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrTooLarge) {
				t.Errorf("byte %d ^ 0x%02x: error %v not typed", i, mask, err)
			}
		}
	}
}

func TestTruncationRefused(t *testing.T) {
	kr := testKeyring(t)
	b := mustMarshal(t, sampleHeader(), kr)
	for n := 0; n < len(b); n++ {
		_, err := Read(bytes.NewReader(b[:n]), kr, t0, time.Minute)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("Read(first %d of %d bytes) = %v; want ErrMalformed", n, len(b), err)
		}
	}
}

// resign recomputes the length field and MAC of a hand-edited header so the
// structural checks, not the MAC, are what refuses it.
func resign(t testing.TB, kr *Keyring, b []byte) []byte {
	t.Helper()
	b = append([]byte(nil), b...)
	b[14], b[15] = byte((len(b)-fixedLen)>>8), byte(len(b)-fixedLen)
	return testPairKey(kr, b).sum(b[:len(b)-macLen], b[:len(b)-macLen])
}

// tlvs splits a marshalled header into its fixed part + address block and
// its TLVs (each with its 3-byte type/length prefix), MAC last.
func tlvs(t testing.TB, b []byte) (head []byte, list [][]byte) {
	t.Helper()
	addrLen := map[byte]int{famUnspec: 0, famTCP4: 12, famTCP6: 36}[b[13]]
	head, p := b[:fixedLen+addrLen], b[fixedLen+addrLen:]
	for len(p) > 0 {
		l := 3 + int(p[1])<<8 + int(p[2])
		list = append(list, p[:l])
		p = p[l:]
	}
	return head, list
}

func join(head []byte, list [][]byte) []byte {
	b := append([]byte(nil), head...)
	for _, x := range list {
		b = append(b, x...)
	}
	return b
}

func TestStructuralRefusals(t *testing.T) {
	kr := testKeyring(t)
	head, list := tlvs(t, mustMarshal(t, sampleHeader(), kr))
	mac := list[len(list)-1]
	body := list[:len(list)-1]
	with := func(extra ...[]byte) []byte {
		l := append(append([][]byte(nil), body...), extra...)
		return resign(t, kr, join(head, append(l, mac)))
	}
	without := func(typ byte) []byte {
		var l [][]byte
		for _, x := range body {
			if x[0] != typ {
				l = append(l, x)
			}
		}
		return resign(t, kr, join(head, append(l, mac)))
	}
	route := func(ids ...string) []byte {
		v := []byte{}
		for _, id := range ids {
			v = append(v, byte(len(id)))
			v = append(v, id...)
		}
		return append([]byte{TLVRoute, byte(len(v) >> 8), byte(len(v))}, v...)
	}
	replace := func(typ byte, tlv []byte, extra ...[]byte) []byte {
		var l [][]byte
		for _, x := range body {
			if x[0] == typ {
				x = tlv
			}
			l = append(l, x)
		}
		l = append(l, extra...)
		return resign(t, kr, join(head, append(l, mac)))
	}
	many := make([]string, MaxRoute+1)
	for i := range many {
		many[i] = "x"
	}
	tests := []struct {
		name string
		b    []byte
	}{
		{"duplicate target", with([]byte{TLVTarget, 0, 4, 'a', ':', '8', '0'})},
		{"unknown critical TLV", with([]byte{0xE9, 0, 1, 0})},
		{"verdict TLV with a value", with([]byte{TLVVerdict, 0, 1, 0})},
		{"duplicate verdict TLV", with([]byte{TLVVerdict, 0, 0}, []byte{TLVVerdict, 0, 0})},
		{"missing route", without(TLVRoute)},
		{"missing time", without(TLVTime)},
		{"missing version", without(TLVVersion)},
		{"bad version", replace(TLVVersion, []byte{TLVVersion, 0, 1, 2})},
		{"hop TLV of 2 bytes", replace(TLVHop, []byte{TLVHop, 0, 2, 0, 1})},
		{"hop past route", replace(TLVHop, []byte{TLVHop, 0, 1, 3})},
		{"too many route entries", replace(TLVRoute, route(many...))},
		{"non-printable id", replace(TLVRoute, route("a", "b\x01", "c"))},
		{"zero-length route entry", replace(TLVRoute, append(route("a", "b", "c"), 0))},
		{"route entry overrun", replace(TLVRoute, append(route("a", "b", "c"), 5, 'x'))},
		{"bad target", replace(TLVTarget, []byte{TLVTarget, 0, 3, 'a', 'b', 'c'})},
		{"lookup before the route's end", with([]byte{TLVLookup, 0, 1, 'x'})},
		{"empty lookup", replace(TLVHop, []byte{TLVHop, 0, 1, 2}, []byte{TLVLookup, 0, 0})},
		{"duplicate lookup", replace(TLVHop, []byte{TLVHop, 0, 1, 2}, []byte{TLVLookup, 0, 1, 'x'}, []byte{TLVLookup, 0, 1, 'y'})},
		{"TLV after MAC", resign(t, kr, append(join(head, append(append([][]byte(nil), body...), mac)), 0x04, 0, 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := Read(bytes.NewReader(tt.b), kr, t0, time.Minute)
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("Read = %+v, %v; want ErrMalformed", h, err)
			}
		})
	}
	// A lookup TLV in a header for the route's last id is accepted.
	h, err := Read(bytes.NewReader(replace(TLVHop, []byte{TLVHop, 0, 1, 2}, []byte{TLVLookup, 0, 3, 'e', 'g', 'p'})), kr, t0, time.Minute)
	if err != nil || h.Lookup != "egp" {
		t.Errorf("Read with a lookup TLV = %+v, %v; want Lookup egp", h, err)
	}
	// A non-critical TLV (PP2_TYPE_NOOP) before the MAC is accepted and authenticated.
	if _, err := Read(bytes.NewReader(with([]byte{0x04, 0, 2, 0, 0})), kr, t0, time.Minute); err != nil {
		t.Errorf("Read with a NOOP TLV: %v", err)
	}
}

func TestTooLarge(t *testing.T) {
	kr := testKeyring(t)
	b := mustMarshal(t, sampleHeader(), kr)
	b[14], b[15] = 0xFF, 0xFF
	r := bytes.NewReader(b)
	if _, err := Read(r, kr, t0, time.Minute); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Read(len 65535) = %v; want ErrTooLarge", err)
	}
	if r.Len() != len(b)-fixedLen {
		t.Errorf("Read consumed %d bytes of an oversize header; want only the %d fixed ones", len(b)-r.Len(), fixedLen)
	}
}

func TestTamperedRouteOrTargetFailsAuth(t *testing.T) {
	kr := testKeyring(t)
	orig := mustMarshal(t, sampleHeader(), kr)
	head, list := tlvs(t, orig)
	for _, tt := range []struct {
		name string
		typ  byte
		tlv  []byte
	}{
		{"altered route", TLVRoute, []byte{TLVRoute, 0, 18, 5, 'f', 'e', 'p', '-', 'a', 5, 'f', 'e', 'p', '-', 'x', 5, 'f', 'e', 'p', '-', 'c'}},
		{"altered target", TLVTarget, append([]byte{TLVTarget, 0, 14}, "evil.test:4433"...)},
		{"altered hop", TLVHop, []byte{TLVHop, 0, 1, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var l [][]byte
			for _, x := range list {
				if x[0] == tt.typ {
					x = tt.tlv
				}
				l = append(l, x)
			}
			b := join(head, l)
			b[14], b[15] = byte((len(b)-fixedLen)>>8), byte(len(b)-fixedLen)
			if _, err := Read(bytes.NewReader(b), kr, t0, time.Minute); !errors.Is(err, ErrAuth) {
				t.Errorf("Read = %v; want ErrAuth", err)
			}
		})
	}
}

func TestKeyRotation(t *testing.T) {
	oldKey := Key{ID: 1, Secret: []byte("old-secret-old-secret")}
	newKey := Key{ID: 2, Secret: []byte("new-secret-new-secret")}
	otherKey := Key{ID: 3, Secret: []byte("other-secret-other-secret")}
	krOld, _ := NewKeyring(oldKey, nil)
	krRot, err := NewKeyring(newKey, &oldKey)
	if err != nil {
		t.Fatal(err)
	}
	krNew, _ := NewKeyring(newKey, nil)
	krOther, _ := NewKeyring(otherKey, nil)
	sameID, _ := NewKeyring(Key{ID: 2, Secret: []byte("impostor-secret!!")}, nil)
	h := sampleHeader()
	tests := []struct {
		name        string
		sign, check *Keyring
		wantErr     error
	}{
		{"old signer, rotating receiver", krOld, krRot, nil},
		{"rotating signer, new-only receiver", krRot, krNew, nil},
		{"rotating signer, rotating receiver", krRot, krRot, nil},
		{"new signer, old-only receiver", krNew, krOld, ErrAuth},
		{"unknown key id", krOther, krRot, ErrAuth},
		{"same id, wrong secret", sameID, krRot, ErrAuth},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(mustMarshal(t, h, tt.sign)), tt.check, t0, time.Minute)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("Read = %v; want %v", err, tt.wantErr)
			}
		})
	}
	if _, err := NewKeyring(newKey, &Key{ID: 2, Secret: oldKey.Secret}); err == nil {
		t.Error("NewKeyring accepted two keys with one id")
	}
	if _, err := NewKeyring(Key{ID: 1, Secret: []byte("short")}, nil); err == nil {
		t.Error("NewKeyring accepted a 5-byte secret")
	}
}

func TestExpiry(t *testing.T) {
	kr := testKeyring(t)
	b := mustMarshal(t, sampleHeader(), kr)
	for _, tt := range []struct {
		now     time.Time
		wantErr error
	}{
		{t0, nil},
		{t0.Add(59 * time.Second), nil},
		{t0.Add(-59 * time.Second), nil},
		{t0.Add(61 * time.Second), ErrExpired},
		{t0.Add(-61 * time.Second), ErrExpired},
	} {
		_, err := Read(bytes.NewReader(b), kr, tt.now, time.Minute)
		if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
			t.Errorf("Read at %v = %v; want %v", tt.now.Sub(t0), err, tt.wantErr)
		}
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestIOErrorKept(t *testing.T) {
	deadline := errors.New("i/o timeout")
	_, err := Read(errReader{deadline}, testKeyring(t), t0, time.Minute)
	if !errors.Is(err, deadline) || errors.Is(err, ErrMalformed) {
		t.Errorf("Read = %v; want the reader's error, not ErrMalformed", err)
	}
}

func TestReplayCache(t *testing.T) {
	c := NewReplayCache(time.Minute, 3)
	now := t0
	c.now = func() time.Time { return now }
	c.start = t0.Add(-time.Hour)
	h := sampleHeader()
	if c.Seen(h) {
		t.Fatal("first Seen = true")
	}
	if !c.Seen(h) {
		t.Fatal("exact replay: Seen = false")
	}
	if err := c.Check(h); !errors.Is(err, ErrReplay) {
		t.Errorf("Check(replay) = %v; want ErrReplay", err)
	}
	next := *h
	next.Hop = 2
	if c.Seen(&next) {
		t.Error("same flow, next hop: Seen = true")
	}
	// Expiry: after issue time + window the entry is dropped.
	now = t0.Add(61 * time.Second)
	if c.Seen(h) {
		t.Error("Seen after expiry = true")
	}
	if c.Len() != 0 {
		t.Errorf("Len after expiry = %d; want 0", c.Len())
	}
	// Capacity bound.
	now = t0
	for i := 0; i < 10; i++ {
		x := *h
		x.FlowID[0] = byte(i)
		x.Time = t0.Add(time.Duration(i) * time.Second)
		c.Seen(&x)
	}
	if c.Len() != 3 || c.Evicted() != 7 {
		t.Errorf("Len, Evicted = %d, %d; want 3, 7", c.Len(), c.Evicted())
	}
	latest := *h
	latest.FlowID[0] = 9
	latest.Time = t0.Add(9 * time.Second)
	if !c.Seen(&latest) {
		t.Error("the newest entry was evicted instead of the oldest")
	}
}

func TestGolden(t *testing.T) {
	kr := testKeyring(t)
	b := mustMarshal(t, sampleHeader(), kr)
	path := filepath.Join("testdata", "sample.hex")
	if *update {
		if err := os.WriteFile(path, []byte(hex.Dump(b)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.Dump(b); got != string(want) {
		t.Errorf("Marshal golden mismatch (run with -update if the format changed on purpose):\n%s\nwant:\n%s", got, want)
	}
}

func TestAppendPlainV2(t *testing.T) {
	tests := []struct {
		name     string
		src, dst string
		want     string
	}{
		{"tcp4", "192.0.2.1:1000", "198.51.100.2:80",
			"0d0a0d0a000d0a515549540a" + "2111000c" + "c0000201" + "c6336402" + "03e8" + "0050"},
		{"tcp6", "[2001:db8::1]:1", "[2001:db8::2]:2",
			"0d0a0d0a000d0a515549540a" + "21210024" + "20010db8000000000000000000000001" + "20010db8000000000000000000000002" + "0001" + "0002"},
		{"unspec", "", "", "0d0a0d0a000d0a515549540a" + "21000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var src, dst netip.AddrPort
			if tt.src != "" {
				src, dst = netip.MustParseAddrPort(tt.src), netip.MustParseAddrPort(tt.dst)
			}
			got := hex.EncodeToString(AppendPlainV2([]byte("x"), src, dst))
			if got != "78"+tt.want {
				t.Errorf("AppendPlainV2 = %s; want 78%s", got, tt.want)
			}
		})
	}
}

func BenchmarkMarshal(b *testing.B) {
	kr := testKeyring(b)
	h := sampleHeader()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Marshal(kr); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRead(b *testing.B) {
	kr := testKeyring(b)
	buf := mustMarshal(b, sampleHeader(), kr)
	r := bytes.NewReader(buf)
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(buf)
		if _, err := Read(r, kr, t0, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	kr := testKeyring(t)
	c := NewReplayCache(time.Minute, 1000)
	c.now = func() time.Time { return t0 }
	c.start = t0.Add(-time.Hour)
	done := make(chan int, 4)
	for g := 0; g < 4; g++ {
		go func() {
			replays := 0
			for i := 0; i < 200; i++ {
				h := sampleHeader()
				h.FlowID[0], h.FlowID[1] = byte(i), byte(i>>8)
				b, err := h.Marshal(kr)
				if err != nil {
					t.Error(err)
					break
				}
				got, err := Read(bytes.NewReader(b), kr, t0, time.Minute)
				if err != nil {
					t.Error(err)
					break
				}
				if c.Seen(got) {
					replays++
				}
			}
			done <- replays
		}()
	}
	total := 0
	for g := 0; g < 4; g++ {
		total += <-done
	}
	// 4 goroutines x the same 200 flow ids: exactly 3 x 200 are replays.
	if total != 600 || c.Len() != 200 {
		t.Errorf("replays = %d, Len = %d; want 600, 200", total, c.Len())
	}
}

// testPairKey returns kr's current key for the sender and receiver a
// (possibly hand-edited) header names, or for fep-a -> fep-b when it names
// none.
func testPairKey(kr *Keyring, b []byte) *pairKey {
	sender, receiver := "fep-a", "fep-b"
	if len(b) >= fixedLen {
		p := b[fixedLen:]
		switch b[13] {
		case famTCP4:
			p = p[min(12, len(p)):]
		case famTCP6:
			p = p[min(36, len(p)):]
		}
		var route []string
		hopIdx := -1
		for len(p) >= 3 {
			typ, l := p[0], int(p[1])<<8|int(p[2])
			if len(p) < 3+l {
				break
			}
			v := p[3 : 3+l]
			p = p[3+l:]
			switch typ {
			case TLVRoute:
				route = nil
				for len(v) > 0 && len(v) >= 1+int(v[0]) {
					route = append(route, string(v[1:1+int(v[0])]))
					v = v[1+int(v[0]):]
				}
			case TLVHop:
				if l == 1 {
					hopIdx = int(v[0])
				}
			}
		}
		if hopIdx >= 1 && hopIdx < len(route) {
			sender, receiver = route[hopIdx-1], route[hopIdx]
		}
	}
	return kr.cur.pair(kr.self, sender, receiver, true)
}

func TestVerdict(t *testing.T) {
	for _, code := range []byte{0, 2, 5} {
		b := AppendVerdict(nil, code)
		if len(b) != VerdictLen {
			t.Fatalf("verdict of %d bytes", len(b))
		}
		if got, err := ParseVerdict([VerdictLen]byte(b)); err != nil || got != code {
			t.Errorf("ParseVerdict(%x) = %d, %v; want %d", b, got, err, code)
		}
	}
	if _, err := ParseVerdict([VerdictLen]byte{'H', 'T'}); !errors.Is(err, ErrMalformed) {
		t.Errorf("ParseVerdict(HT) = %v; want ErrMalformed (an origin's bytes, not a verdict)", err)
	}
}
