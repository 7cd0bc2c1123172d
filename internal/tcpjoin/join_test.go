package tcpjoin

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

const two32 = 1 << 32

// isn draws an initial sequence number, often near the wrap-around.
func isn(r *rand.Rand) uint32 {
	switch r.IntN(4) {
	case 0:
		return uint32(two32 - 1 - r.IntN(70000))
	case 1:
		return uint32(r.IntN(70000))
	}
	return r.Uint32()
}

// count draws a byte count already carried (can exceed 2^32: it wraps).
func count(r *rand.Rand) uint64 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return uint64(r.IntN(2000))
	case 2:
		return two32 + uint64(r.IntN(1<<20))
	}
	return r.Uint64N(1 << 36)
}

// The seed's formulas 1-4 are Plan's entries for connections that carried
// only the request (router -> client: nothing, surrogate -> router:
// nothing).
func TestSeedFormulas(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		srs, scr, src, ssr := isn(r), isn(r), isn(r), isn(r)
		rrs, rcr := uint32(r.IntN(9000)), uint32(r.IntN(9000))
		j, err := Plan(Conn{LocalISN: src, RemoteISN: scr, Received: rcr}, Conn{LocalISN: srs, RemoteISN: ssr, Sent: rrs})
		if err != nil {
			t.Fatal(err)
		}
		s1, a2, s3, a4 := SeedFormulas(srs, scr, rrs, rcr, src, ssr)
		cs, sc := j.ClientToSurrogate, j.SurrogateToClient
		if cs.SeqDelta != s1 || sc.AckDelta != a2 || sc.SeqDelta != s3 || cs.AckDelta != a4 {
			t.Fatalf("ISNs %d %d %d %d, requests %d %d: Plan %+v; seed %d %d %d %d", srs, scr, src, ssr, rrs, rcr, j, s1, a2, s3, a4)
		}
	}
}

// segment builds a TCP header with the given fields and options.
func segment(seq, ack uint32, win uint16, opts []byte) []byte {
	for len(opts)%4 != 0 {
		opts = append(opts, optNOP)
	}
	h := make([]byte, 20+len(opts))
	binary.BigEndian.PutUint16(h[0:], 40000)
	binary.BigEndian.PutUint16(h[2:], 80)
	binary.BigEndian.PutUint32(h[offSeq:], seq)
	binary.BigEndian.PutUint32(h[offAck:], ack)
	h[offOff] = byte(len(h)/4) << 4
	h[offFlags] = flagACK
	binary.BigEndian.PutUint16(h[offWin:], win)
	copy(h[20:], opts)
	return h
}

func sackOpt(edges ...uint32) []byte {
	o := []byte{optNOP, optNOP, optSACK, byte(2 + 4*len(edges))}
	for _, e := range edges {
		o = binary.BigEndian.AppendUint32(o, e)
	}
	return o
}

func tsOpt(val, ecr uint32) []byte {
	o := []byte{optNOP, optNOP, optTS, 10}
	o = binary.BigEndian.AppendUint32(o, val)
	return binary.BigEndian.AppendUint32(o, ecr)
}

func u32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

// mod is the model's only modular step: an unbounded stream position taken
// to the wire.
func mod(x uint64) uint32 { return uint32(x % two32) }

// TestPlanBruteForce checks every translated field against a model that
// numbers bytes as unbounded integers (no modular increments): the client's
// byte k after the join is the surrogate's byte Rrs+k, with random ISNs,
// random byte counts already carried (wrapping the 32-bit space), SACK
// blocks, timestamps and window shifts.
func TestPlanBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 20000 {
		// The unbounded state of both connections.
		scr, src, srs, ssr := isn(r), isn(r), isn(r), isn(r)
		rcr, tc := count(r), count(r) // client -> router, router -> client
		rrs, ts := count(r), count(r) // router -> surrogate, surrogate -> router
		cts, rcts, rsts, sts := r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32()
		c := Conn{LocalISN: src, RemoteISN: scr, Sent: mod(tc), Received: mod(rcr), TS: true,
			LocalTSval: rcts, RemoteTSval: cts, LocalWScale: uint8(r.IntN(15)), RemoteWScale: uint8(r.IntN(15))}
		s := Conn{LocalISN: srs, RemoteISN: ssr, Sent: mod(rrs), Received: mod(ts), TS: true,
			LocalTSval: rsts, RemoteTSval: sts, LocalWScale: uint8(r.IntN(15)), RemoteWScale: uint8(r.IntN(15))}
		j, err := Plan(c, s)
		if err != nil {
			t.Fatal(err)
		}
		// Client -> surrogate: a segment carrying client byte k after the
		// join, acknowledging surrogate byte a after the join, SACKing
		// surrogate bytes [b1, b2), at client clock +dt ms, echoing the
		// surrogate's TSval v (as the client saw it).
		k, a := r.Uint64N(1<<33), r.Uint64N(1<<33)
		b1 := a + 1 + r.Uint64N(1<<20)
		b2 := b1 + 1 + r.Uint64N(1<<20)
		dt := r.Uint32N(1 << 20)
		v := sts + r.Uint32N(1<<20) // a surrogate TSval after the join
		realWin := uint64(r.Uint32N(1<<30)) >> c.RemoteWScale << c.RemoteWScale
		seg := segment(
			mod(uint64(scr)+1+rcr+k), mod(uint64(src)+1+tc+a), uint16(min(realWin>>c.RemoteWScale, 0xffff)),
			append(sackOpt(mod(uint64(src)+1+tc+b1), mod(uint64(src)+1+tc+b2)), tsOpt(cts+dt, v+(rcts-sts))...))
		if err := j.ClientToSurrogate.Apply(seg); err != nil {
			t.Fatal(err)
		}
		want := []uint32{
			mod(uint64(srs) + 1 + rrs + k), // the surrogate's view of client byte k
			mod(uint64(ssr) + 1 + ts + a),  // ... of its own byte a
			mod(uint64(ssr) + 1 + ts + b1),
			mod(uint64(ssr) + 1 + ts + b2),
			rsts + dt, // continues the router's clock on s
			v,         // echo of what the surrogate sent
		}
		got := []uint32{u32(seg[offSeq:]), u32(seg[offAck:]), u32(seg[24:]), u32(seg[28:]), u32(seg[36:]), u32(seg[40:])}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("trial %d client->surrogate field %d = %d; want %d (join %+v)", trial, i, got[i], want[i], j)
			}
		}
		checkWindow(t, uint64(binary.BigEndian.Uint16(seg[offWin:])), min(realWin>>c.RemoteWScale, 0xffff)<<c.RemoteWScale, s.LocalWScale)

		// Surrogate -> client: surrogate byte m after the join, acking
		// client byte n after the join.
		m, n := r.Uint64N(1<<33), r.Uint64N(1<<33)
		seg = segment(mod(uint64(ssr)+1+ts+m), mod(uint64(srs)+1+rrs+n), 1000,
			append(tsOpt(sts+dt, cts+dt+(rsts-cts)), sackOpt(mod(uint64(srs)+1+rrs+n+5), mod(uint64(srs)+1+rrs+n+9))...))
		if err := j.SurrogateToClient.Apply(seg); err != nil {
			t.Fatal(err)
		}
		want = []uint32{
			mod(uint64(src) + 1 + tc + m),
			mod(uint64(scr) + 1 + rcr + n),
			rcts + dt, // continues the router's clock on c
			cts + dt,  // the client's own TSval, echoed
			mod(uint64(scr) + 1 + rcr + n + 5),
			mod(uint64(scr) + 1 + rcr + n + 9),
		}
		got = []uint32{u32(seg[offSeq:]), u32(seg[offAck:]), u32(seg[24:]), u32(seg[28:]), u32(seg[36:]), u32(seg[40:])}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("trial %d surrogate->client field %d = %d; want %d (join %+v)", trial, i, got[i], want[i], j)
			}
		}
	}
}

// checkWindow: the rewritten field, scaled by the receiver's shift, never
// announces more than the sender's window, and loses less than one unit
// (unless capped at 65535 units).
func checkWindow(t *testing.T, field, real uint64, shift uint8) {
	t.Helper()
	got := field << shift
	if got > real {
		t.Fatalf("window %d announced for a real window of %d", got, real)
	}
	if field < 0xffff && real-got >= 1<<shift {
		t.Fatalf("window %d announced for %d (shift %d): lost a unit or more", got, real, shift)
	}
}

func TestPlanMismatch(t *testing.T) {
	if _, err := Plan(Conn{TS: true}, Conn{}); !errors.Is(err, ErrMismatch) {
		t.Errorf("timestamps on one side: %v; want ErrMismatch", err)
	}
	if _, err := Plan(Conn{RemoteMSS: 1400}, Conn{RemoteMSS: 1460}); !errors.Is(err, ErrMismatch) {
		t.Errorf("surrogate MSS above the client's: %v; want ErrMismatch", err)
	}
	if _, err := Plan(Conn{RemoteMSS: 1460, SACK: true}, Conn{RemoteMSS: 1400}); err != nil {
		t.Errorf("compatible connections: %v", err)
	}
}

// checksum is the full TCP checksum over an IPv4 pseudo-header.
func checksum(seg []byte) uint16 {
	var s uint32
	s += 0x0a00 + 0x0001 + 0x0a00 + 0x0002 // 10.0.0.1 -> 10.0.0.2
	s += 6 + uint32(len(seg))
	for i := 0; i+1 < len(seg); i += 2 {
		s += uint32(binary.BigEndian.Uint16(seg[i:]))
	}
	if len(seg)%2 == 1 {
		s += uint32(seg[len(seg)-1]) << 8
	}
	return ^fold(s)
}

func withChecksum(seg []byte) []byte {
	binary.BigEndian.PutUint16(seg[offSum:], 0)
	binary.BigEndian.PutUint16(seg[offSum:], checksum(seg))
	return seg
}

func TestApplyChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 10000 {
		e := Entry{SeqDelta: r.Uint32(), AckDelta: r.Uint32(), TS: true, TSvalDelta: r.Uint32(), TSecrDelta: r.Uint32(),
			WinIn: uint8(r.IntN(15)), WinOut: uint8(r.IntN(15))}
		// An odd-aligned SACK (one NOP) and a payload of odd length.
		opts := append([]byte{optNOP}, sackOpt(r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32())[2:]...)
		opts = append(opts, tsOpt(r.Uint32(), r.Uint32())...)
		seg := segment(r.Uint32(), r.Uint32(), uint16(r.Uint32()), opts)
		payload := make([]byte, r.IntN(50))
		for i := range payload {
			payload[i] = byte(r.Uint32())
		}
		seg = withChecksum(append(seg, payload...))
		if err := e.Apply(seg); err != nil {
			t.Fatal(err)
		}
		if checksum(seg) != 0 {
			t.Fatalf("checksum invalid after Apply(%+v)", e)
		}
	}
}

func TestApplyErrors(t *testing.T) {
	e := Entry{SeqDelta: 1}
	syn := segment(1, 0, 1, nil)
	syn[offFlags] = flagSYN
	for name, seg := range map[string][]byte{
		"short":     make([]byte, 10),
		"offset":    append(segment(1, 1, 1, nil)[:12], 0x10, flagACK, 0, 0, 0, 0, 0, 0),
		"syn":       syn,
		"overrun":   segment(1, 1, 1, []byte{optSACK, 30, 0, 0}),
		"zero len":  segment(1, 1, 1, []byte{optTS, 0, 0, 0}),
		"sack len":  segment(1, 1, 1, []byte{optSACK, 6, 0, 0, 0, 0}),
		"short ts":  segment(1, 1, 1, []byte{optTS, 6, 0, 0, 0, 0}),
		"truncated": segment(1, 1, 1, []byte{optNOP, optNOP, optNOP, optTS}),
	} {
		if err := e.Apply(seg); !errors.Is(err, ErrHeader) {
			t.Errorf("%s: Apply = %v; want ErrHeader", name, err)
		}
	}
}

func FuzzApply(f *testing.F) {
	f.Add(withChecksum(segment(1, 2, 3, append(sackOpt(5, 9), tsOpt(7, 8)...))), uint32(1), uint32(2), uint8(3), uint8(4))
	f.Fuzz(func(t *testing.T, seg []byte, d1, d2 uint32, w1, w2 uint8) {
		e := Entry{SeqDelta: d1, AckDelta: d2, TS: true, TSvalDelta: d1 ^ d2, TSecrDelta: d2 - d1, WinIn: w1 % 15, WinOut: w2 % 15}
		valid := len(seg) >= 20 && checksum(seg) == 0
		if err := e.Apply(seg); err != nil {
			return
		}
		if valid && checksum(seg) != 0 {
			t.Fatalf("Apply broke a valid checksum")
		}
	})
}
