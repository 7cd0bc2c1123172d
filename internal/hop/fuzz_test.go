package hop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"
)

// FuzzRead checks that Read never panics, never reads past the announced
// header, types every refusal, and that whatever it accepts re-marshals to
// the same bytes. With resign set, the input's length field and MAC are
// fixed up first, so the fuzzer reaches the checks behind the MAC.
func FuzzRead(f *testing.F) {
	kr := testKeyring(f)
	good := mustMarshal(f, sampleHeader(), kr)
	f.Add(good, false)
	f.Add(good, true)
	f.Add(good[:40], false)
	lk := sampleHeader()
	lk.Route, lk.Hop, lk.Lookup = []string{"edge", "lop"}, 1, "fep-c"
	f.Add(mustMarshal(f, lk, kr), false)
	f.Add(mustMarshal(f, lk, kr), true)
	vh := sampleHeader()
	vh.Verdict = true
	f.Add(mustMarshal(f, vh, kr), true)
	f.Add(AppendPlainV2(nil, sampleHeader().Source, sampleHeader().Dest), true)
	f.Add([]byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), false)
	f.Add(append(append([]byte(nil), good...), "trailing payload"...), false)
	f.Fuzz(func(t *testing.T, data []byte, resign bool) {
		if resign && len(data) >= fixedLen+macLen && len(data) <= MaxHeaderLen {
			data = append([]byte(nil), data...)
			binary.BigEndian.PutUint16(data[14:16], uint16(len(data)-fixedLen))
			n := len(data) - macLen
			testPairKey(kr, data).sum(data[:n], data[:n])
		}
		r := bytes.NewReader(data)
		h, err := Read(r, kr, t0, time.Minute)
		used := len(data) - r.Len()
		if used > MaxHeaderLen {
			t.Fatalf("read %d bytes, limit %d", used, MaxHeaderLen)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrExpired) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if err := h.validate(); err != nil {
			t.Fatalf("accepted an invalid header %+v: %v", h, err)
		}
		again, err := h.Marshal(kr)
		if err != nil {
			t.Fatalf("accepted header does not marshal: %v", err)
		}
		back, err := Read(bytes.NewReader(again), kr, t0, time.Minute)
		if err != nil || !equalHeader(back, h) {
			t.Fatalf("re-marshalled header reads back as %+v, %v; want %+v", back, err, h)
		}
	})
}

// FuzzRoundTrip marshals arbitrary field values: Marshal either refuses
// them or Read returns exactly them.
func FuzzRoundTrip(f *testing.F) {
	kr := testKeyring(f)
	f.Add([]byte{192, 0, 2, 1}, uint16(1), "a,b,c", uint8(1), "origin:443", int64(1<<20), int64(0), "")
	f.Add([]byte{0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(65535), "x", uint8(0), "[::1]:1", int64(0), int64(-5), "")
	f.Add([]byte{192, 0, 2, 1}, uint16(1), "edge,lop", uint8(1), "origin:443", int64(1<<20), int64(0), "egp")
	f.Fuzz(func(t *testing.T, ip []byte, port uint16, route string, hopIdx uint8, target string, size, skewMS int64, lookup string) {
		h := sampleHeader()
		if a, ok := netip.AddrFromSlice(ip); ok {
			h.Source = netip.AddrPortFrom(a, port)
		}
		h.Route = splitComma(route)
		h.Hop = int(hopIdx)
		h.Target = target
		h.Size = size
		h.Lookup = lookup
		h.Time = t0.Add(time.Duration(skewMS%120000) * time.Millisecond)
		b, err := h.Marshal(kr)
		if err != nil {
			return
		}
		got, err := Read(bytes.NewReader(b), kr, t0, time.Minute)
		d := h.Time.Sub(t0)
		if d > time.Minute || d < -time.Minute {
			if !errors.Is(err, ErrExpired) {
				t.Fatalf("skew %v: Read = %v; want ErrExpired", d, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Read(Marshal(%+v)) = %v", h, err)
		}
		want := *h
		want.Source = netip.AddrPortFrom(h.Source.Addr().Unmap().WithZone(""), h.Source.Port())
		if h.Source.Addr().Unmap().Is4() != h.Dest.Addr().Unmap().Is4() {
			want.Dest = netip.AddrPortFrom(h.Dest.Addr().Unmap(), h.Dest.Port())
		}
		if !equalHeader(got, &want) {
			t.Fatalf("Read(Marshal(h)) = %+v; want %+v", got, &want)
		}
	})
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}
