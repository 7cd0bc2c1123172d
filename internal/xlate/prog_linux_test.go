//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/mosto-net/mosto/internal/testenv"
)

const tcActOK, tcActShot, tcActRedirect = 0, 2, 7

// tcxNext is TCX_NEXT (TC_ACT_UNSPEC, -1) as prog.Run returns it: the
// program's answer to a packet that is not its own.
const tcxNext = 0xffffffff

func loadTest(t *testing.T, maxEntries int) *Splicer {
	t.Helper()
	testenv.RequirePrivileged(t)
	s, err := newUnattached(maxEntries)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// run runs the program on one frame and decodes the result.
func run(t *testing.T, prog *ebpf.Program, in testPkt) (uint32, testPkt) {
	t.Helper()
	ret, p, err := runPkt(prog, in)
	if err != nil {
		t.Fatal(err)
	}
	return ret, p
}

// runPkt is run for goroutines other than the test's (t.Fatal must not be
// called there): it returns the error.
func runPkt(prog *ebpf.Program, in testPkt) (uint32, testPkt, error) {
	b := in.bytes()
	out := make([]byte, len(b)+64)
	ret, err := prog.Run(&ebpf.RunOptions{Data: b, DataOut: out})
	if err != nil {
		return 0, testPkt{}, fmt.Errorf("prog.Run: %w", err)
	}
	p, err := decodePkt(out)
	if err != nil {
		return 0, testPkt{}, fmt.Errorf("decode output: %w", err)
	}
	return ret, p, nil
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// testPair is a join of a = peer1(P1) <-> relay(RA) and b = relay(RB) <->
// peer2(P2), with sequence numbers chosen so that both directions wrap.
func testPair(v6 bool) (SockState, SockState) {
	p1, ra, rb, p2 := ap("10.1.0.1:40000"), ap("10.1.0.2:8080"), ap("10.2.0.2:50000"), ap("10.2.0.1:80")
	if v6 {
		p1, ra, rb, p2 = ap("[fd00:1::1]:40000"), ap("[fd00:1::2]:8080"), ap("[fd00:2::2]:50000"), ap("[fd00:2::1]:80")
	}
	a := SockState{Local: ra, Remote: p1, SndNxt: 0xfffffff0, RcvNxt: 0x10, Timestamps: true, SACK: true, WScale: true,
		SndWScale: 7, RcvWScale: 9, TSOffset: 0x7000_0000, AdvMSS: 1460, SndMSS: 1448}
	b := SockState{Local: rb, Remote: p2, SndNxt: 0xffffff00, RcvNxt: 0x8000_0000, Timestamps: true, SACK: true, WScale: true,
		SndWScale: 2, RcvWScale: 10, TSOffset: 0x1234_5678, AdvMSS: 1460, SndMSS: 1448}
	return a, b
}

func TestProgramTranslates(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			s := loadTest(t, 16)
			prog := s.objs.XlateEth
			a, b := testPair(v6)
			ab, ba, err := Pair(a, b)
			if err != nil {
				t.Fatal(err)
			}
			ab.Ifindex, ba.Ifindex = 1, 1
			if err := s.Install(ab, ba); err != nil {
				t.Fatal(err)
			}

			// peer1 -> relay A, with data at A's rcv_nxt acknowledging A's
			// snd_nxt, one SACK block per case, first TSval latches.
			payload := bytes.Repeat([]byte("x"), 100)
			for nblocks := 1; nblocks <= 4; nblocks++ {
				in := testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt - 0x20, Ack: a.SndNxt + 0x30,
					Flags: tcpACK | tcpPSH, Win: 1000, TS: true, TSval: 5000 + uint32(nblocks), TSecr: 777, Payload: payload}
				for i := range nblocks {
					// Edges on both sides of the wrap of A's send space.
					lo := a.SndNxt + uint32(i)*0x10
					in.SACK = append(in.SACK, [2]uint32{lo, lo + 8})
				}
				// 40 bytes of options hold timestamps and 3 SACK blocks, or 4
				// blocks alone.
				in.TS = nblocks < 4
				before := uint32(monoNow()/time.Millisecond) + b.TSOffset
				ret, out := run(t, prog, in)
				after := uint32(monoNow()/time.Millisecond) + b.TSOffset + 1
				if ret != tcActRedirect {
					t.Fatalf("return %d, want redirect", ret)
				}
				if out.Src != b.Local || out.Dst != b.Remote {
					t.Errorf("addresses %s->%s, want %s->%s", out.Src, out.Dst, b.Local, b.Remote)
				}
				if want := b.SndNxt - 0x20; out.Seq != want {
					t.Errorf("seq %#x, want %#x (wrapped)", out.Seq, want)
				}
				if want := b.RcvNxt + 0x30; out.Ack != want {
					t.Errorf("ack %#x, want %#x", out.Ack, want)
				}
				// 1000 << 7 (peer1's scale) >> 10 (what peer2 expects from b).
				if want := uint16(1000 << 7 >> 10); out.Win != want {
					t.Errorf("window %d, want %d", out.Win, want)
				}
				if len(out.SACK) != nblocks {
					t.Fatalf("%d SACK blocks, want %d", len(out.SACK), nblocks)
				}
				for i, blk := range out.SACK {
					lo := b.RcvNxt + uint32(i)*0x10
					if blk != [2]uint32{lo, lo + 8} {
						t.Errorf("SACK block %d = %#x, want [%#x %#x]", i, blk, lo, lo+8)
					}
				}
				// The first TSval becomes b's clock now; later ones keep
				// peer1's increments.
				if nblocks == 1 {
					if out.TSval-before > after-before {
						t.Errorf("latched TSval %d outside [%d, %d]", out.TSval, before, after)
					}
					if out.TSecr != 0 {
						t.Errorf("TSecr %d before the reverse latched, want 0", out.TSecr)
					}
				}
				if !bytes.Equal(out.Payload, payload) {
					t.Error("payload changed")
				}
			}
			// The deltas are latched: TSval moves by peer1's increments.
			_, o1 := run(t, prog, testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, TS: true, TSval: 6000, TSecr: 1})
			_, o2 := run(t, prog, testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, TS: true, TSval: 6010, TSecr: 1})
			if o2.TSval-o1.TSval != 10 {
				t.Errorf("TSval step %d, want 10", o2.TSval-o1.TSval)
			}
			// peer2 echoes a translated TSval: peer1 gets its own back.
			in2 := testPkt{Src: b.Remote, Dst: b.Local, Seq: b.RcvNxt + 5, Ack: b.SndNxt + 0x100, Flags: tcpACK,
				Win: 300, TS: true, TSval: 999_000, TSecr: o2.TSval, SACK: [][2]uint32{{b.SndNxt + 0x10, b.SndNxt + 0x40}}}
			ret, out2 := run(t, prog, in2)
			if ret != tcActRedirect {
				t.Fatalf("reverse return %d", ret)
			}
			if out2.Src != a.Local || out2.Dst != a.Remote {
				t.Errorf("reverse addresses %s->%s", out2.Src, out2.Dst)
			}
			if out2.Seq != a.SndNxt+5 || out2.Ack != a.RcvNxt+0x100 {
				t.Errorf("reverse seq/ack %#x/%#x, want %#x/%#x", out2.Seq, out2.Ack, a.SndNxt+5, a.RcvNxt+0x100)
			}
			if out2.TSecr != 6010 {
				t.Errorf("reverse TSecr %d, want 6010 (peer1's own TSval)", out2.TSecr)
			}
			if want := uint16(300 << 2 >> 9); out2.Win != want {
				t.Errorf("reverse window %d, want %d", out2.Win, want)
			}
			if got, want := out2.SACK[0], [2]uint32{a.RcvNxt + 0x10, a.RcvNxt + 0x40}; got != want {
				t.Errorf("reverse SACK %#x, want %#x", got, want)
			}
			// Now peer1's TSecr (echoing peer2's translated TSval) maps back.
			_, o3 := run(t, prog, testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, TS: true, TSval: 6020, TSecr: out2.TSval})
			if o3.TSecr != 999_000 {
				t.Errorf("TSecr %d, want 999000 (peer2's own TSval)", o3.TSecr)
			}
			// A large window saturates instead of wrapping.
			_, o4 := run(t, prog, testPkt{Src: b.Remote, Dst: b.Local, Seq: b.RcvNxt, Ack: b.SndNxt, Flags: tcpACK, Win: 65535, TS: true, TSval: 999_001})
			if want := uint16(65535 << 2 >> 9); o4.Win != want {
				t.Errorf("window %d, want %d", o4.Win, want)
			}

			st := s.Stats()
			if st.Packets != 9 || st.Redirected != 9 || st.Bytes != 400 || st.Latched != 2 || st.Errors != 0 {
				t.Errorf("counters %+v, want 9 packets, 400 bytes, 2 latched", st)
			}
		})
	}
}

// Scaling the other way: a sender with a larger scale than the receiver
// expects saturates at 65535.
func TestProgramWindowSaturates(t *testing.T) {
	s := loadTest(t, 16)
	a, b := testPair(false)
	a.SndWScale, b.RcvWScale = 9, 2
	ab, ba, err := Pair(a, b)
	if err != nil {
		t.Fatal(err)
	}
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.Install(ab, ba); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ in, want uint16 }{{1, 128}, {511, 65408}, {512, 65535}, {65535, 65535}} {
		_, out := run(t, s.objs.XlateEth, testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, Win: c.in, TS: true, TSval: 1})
		if out.Win != c.want {
			t.Errorf("window %d -> %d, want %d", c.in, out.Win, c.want)
		}
	}
}

func TestProgramPassesOthers(t *testing.T) {
	s := loadTest(t, 16)
	a, b := testPair(false)
	ab, ba, _ := Pair(a, b)
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.Install(ab, ba); err != nil {
		t.Fatal(err)
	}
	// Another connection of the same hosts: untouched.
	other := testPkt{Src: ap("10.1.0.1:40001"), Dst: a.Local, Seq: 1, Ack: 2, Flags: tcpACK, Win: 10}
	ret, out := run(t, s.objs.XlateEth, other)
	if ret != tcxNext || out.Seq != 1 || out.Src != other.Src || out.Dst != other.Dst {
		t.Errorf("unrelated packet: return %d, %+v; want TCX_NEXT, untouched", ret, out)
	}
	// A matched packet whose data offset claims more than the segment has.
	bad := testPkt{Src: a.Remote, Dst: a.Local, Seq: 1, Flags: tcpACK}.bytes()
	bad[14+20+12] = 0xf0 // doff 60 > 20 bytes of segment
	ret, err := s.objs.XlateEth.Run(&ebpf.RunOptions{Data: bad})
	if err != nil || ret != tcActOK {
		t.Errorf("malformed: return %d, %v; want pass", ret, err)
	}
	if st := s.Stats(); st.Passed != 1 || st.Packets != 0 {
		t.Errorf("counters %+v, want 1 passed, 0 translated", st)
	}
	// FIN and RST are translated and recorded.
	run(t, s.objs.XlateEth, testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK | tcpFIN, TS: true, TSval: 9})
	sp := &Splice{AB: ab, BA: ba, s: s}
	e1, e2, ok := sp.Stats()
	if !ok || !e1.FIN || e2.FIN || e1.Packets != 1 {
		t.Errorf("entry stats %+v %+v %v, want FIN on ab only", e1, e2, ok)
	}
}

// TestProgramHolds: a join installed in two phases drops its packets
// (neither translated nor passed to the relay's sockets) until its hold is
// lifted; then the next packet clears the entry's hold flag and is
// translated. A rolled-back install leaves nothing behind.
func TestProgramHolds(t *testing.T) {
	s := loadTest(t, 16)
	a, b := testPair(false)
	ab, ba, _ := Pair(a, b)
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.installHeld(ab, ba, true); err != nil {
		t.Fatal(err)
	}
	fromP1 := testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, Win: 100, TS: true, TSval: 5, Payload: []byte("held")}
	fromP2 := testPkt{Src: b.Remote, Dst: b.Local, Seq: b.RcvNxt, Ack: b.SndNxt, Flags: tcpACK, Win: 100, TS: true, TSval: 7}
	for _, p := range []testPkt{fromP1, fromP2} {
		if ret, out := run(t, s.objs.XlateEth, p); ret != tcActShot || out.Src != p.Src || out.Seq != p.Seq {
			t.Errorf("held entry: return %d, %+v; want a drop, untouched", ret, out)
		}
	}
	if st := s.Stats(); st.Packets != 0 || st.Latched != 0 {
		t.Errorf("counters %+v while held, want nothing translated", st)
	}
	s.unhold(ab, ba)
	ret, out := run(t, s.objs.XlateEth, fromP1)
	if ret != tcActRedirect || out.Src != ab.Out.Src || out.Seq != fromP1.Seq+ab.SeqAdd {
		t.Errorf("after unhold: return %d, %+v; want translated", ret, out)
	}
	var v xlateEntry
	k := tupleKey(ab.In)
	if err := s.objs.Joins.Lookup(&k, &v); err != nil || v.Flags&fHold != 0 || v.Flags&fTSvalSet == 0 {
		t.Errorf("entry after its first packet: flags %#x, %v; want the hold cleared, TSval latched", v.Flags, err)
	}
	// The reverse entry: the latch above wrote into it while it was still
	// flagged; its hold flag goes with its own first packet.
	if ret, _ := run(t, s.objs.XlateEth, fromP2); ret != tcActRedirect {
		t.Errorf("reverse after unhold: return %d, want translated", ret)
	}
	k = tupleKey(ba.In)
	if err := s.objs.Joins.Lookup(&k, &v); err != nil || v.Flags&fHold != 0 || v.Flags&fTSecrSet == 0 {
		t.Errorf("reverse entry: flags %#x, %v; want the hold cleared, TSecr known", v.Flags, err)
	}

	// A rollback: held, removed, unheld: the packets reach the stack.
	s.Remove(ab.In)
	if err := s.installHeld(ab, ba, true); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.removePair(ab.In, ba.In)
	s.unhold(ab, ba)
	s.mu.Unlock()
	if ret, out := run(t, s.objs.XlateEth, fromP1); ret != tcxNext || out.Seq != fromP1.Seq {
		t.Errorf("after a rollback: return %d, %+v; want passed on untouched", ret, out)
	}
	var hk xlateTuple
	var hv uint8
	if s.objs.Holds.Iterate().Next(&hk, &hv) {
		t.Errorf("holds map not empty after the rollback: %v", keyTuple(hk))
	}
}

func TestInstallRefusals(t *testing.T) {
	s := loadTest(t, 2)
	a, b := testPair(false)
	ab, ba, _ := Pair(a, b)
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.Install(ab, ba); err != nil {
		t.Fatal(err)
	}
	var re *RefusedError
	if err := s.Install(ab, ba); !asRefused(err, &re) || re.Reason != ReasonExists {
		t.Errorf("second install: %v, want %s", err, ReasonExists)
	}
	// The map holds 2 entries: a second join does not fit, and nothing of
	// it stays installed.
	a2, b2 := a, b
	a2.Remote = ap("10.1.0.1:40002")
	cd, dc, _ := Pair(a2, b2)
	cd.Ifindex, dc.Ifindex = 1, 1
	dc.In.Src = ap("10.2.0.1:81")
	if err := s.Install(cd, dc); !asRefused(err, &re) || re.Reason != ReasonMapFull {
		t.Errorf("install into a full map: %v, want %s", err, ReasonMapFull)
	}
	if !s.Remove(ba.In) || s.Remove(ab.In) {
		t.Error("Remove by either tuple removes the pair once")
	}
	if err := s.Install(cd, dc); err != nil {
		t.Errorf("install after remove: %v", err)
	}
}

// BenchmarkProgram times the translation of one MTU-sized data segment with
// timestamps and a SACK block (BPF_PROG_TEST_RUN, repeated in the kernel),
// next to an unrelated packet that only pays the map lookup.
func BenchmarkProgram(b *testing.B) {
	testenv.RequirePrivileged(b)
	s, err := newUnattached(16)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	a, bb := testPair(false)
	ab, ba, _ := Pair(a, bb)
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.Install(ab, ba); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		pkt  testPkt
	}{
		{"translate-1448B", testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, Win: 500, TS: true, TSval: 1, TSecr: 2,
			SACK: [][2]uint32{{a.SndNxt + 10, a.SndNxt + 20}}, Payload: make([]byte, 1448-12-12)}},
		{"miss", testPkt{Src: ap("10.9.9.9:1"), Dst: a.Local, Seq: 1, Flags: tcpACK, Payload: make([]byte, 1448)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			pkt := c.pkt.bytes()
			_, d, err := s.objs.XlateEth.Benchmark(pkt, b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/pkt")
			b.ReportMetric(1e9/float64(d.Nanoseconds())/1e6, "Mpkt/s")
			b.ReportMetric(1e9/float64(d.Nanoseconds())*float64(len(pkt))*8/1e9, "Gbit/s")
		})
	}
}

// TestProgramMarks: an entry's high-water marks (EntryStats.SeqHi/AckHi,
// in the sender's sequence space) start at Pair's values, move only
// forward across the wrap of the sequence space, count a FIN, and ignore
// an older (retransmitted) segment or ACK.
func TestProgramMarks(t *testing.T) {
	s := loadTest(t, 16)
	prog := s.objs.XlateEth
	a, b := testPair(false)
	ab, ba, err := Pair(a, b)
	if err != nil {
		t.Fatal(err)
	}
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.Install(ab, ba); err != nil {
		t.Fatal(err)
	}
	marks := func() (uint32, uint32) {
		t.Helper()
		st, ok := s.Entry(ab.In)
		if !ok || !st.Marks {
			t.Fatalf("entry %v: ok %v, marks %v", ab.In, ok, st.Marks)
		}
		return st.SeqHi, st.AckHi
	}
	if seq, ack := marks(); seq != a.RcvNxt || ack != a.SndNxt {
		t.Fatalf("marks after install %#x/%#x; want Pair's %#x/%#x", seq, ack, a.RcvNxt, a.SndNxt)
	}
	payload := bytes.Repeat([]byte("y"), 100)
	steps := []struct {
		name             string
		seq, ack         uint32 // offsets from a.RcvNxt, a.SndNxt
		flags            byte
		n                int
		wantSeq, wantAck uint32 // offsets
	}{
		{"data", 0, 0x20, tcpACK, 100, 100, 0x20},                 // a.SndNxt+0x20 wraps
		{"retransmission", 0, 0x10, tcpACK, 100, 100, 0x20},       // older ack: kept
		{"pure ack", 100, 0x40, tcpACK, 0, 100, 0x40},             // no payload: seq kept
		{"fin", 100, 0x40, tcpACK | tcpFIN, 0, 101, 0x40},         // FIN counts one
		{"old segment", 0xfffff000, 0x40, tcpACK, 100, 101, 0x40}, // before the start
		{"ahead", 0x7fff0000, 0x7fff0000, tcpACK, 0, 0x7fff0000, 0x7fff0000},
	}
	for _, st := range steps {
		in := testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt + st.seq, Ack: a.SndNxt + st.ack, Flags: st.flags,
			Win: 1000, TS: true, TSval: 5000, TSecr: 777, Payload: payload[:st.n]}
		if ret, _ := run(t, prog, in); ret != tcActRedirect {
			t.Fatalf("%s: return %d, want redirect", st.name, ret)
		}
		seq, ack := marks()
		if seq != a.RcvNxt+st.wantSeq || ack != a.SndNxt+st.wantAck {
			t.Errorf("%s: marks %#x/%#x; want %#x/%#x", st.name, seq, ack, a.RcvNxt+st.wantSeq, a.SndNxt+st.wantAck)
		}
	}
}

// TestProgramSYNRetires: a SYN without ACK on a joined tuple (a client that
// reuses its port for a new connection while the old flow's entries
// linger) goes to the stack untranslated and retires the entry it
// matched; the sweeper then removes the pair. Translated, it and the
// request behind it reached the other leg's peer as a new connection from
// the old tuple (Fig. 4 chain: the next relay refused the request as a
// malformed hop header and the client read a reset). Other packets are
// still translated.
func TestProgramSYNRetires(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		s := loadTest(t, 16)
		a, b := testPair(v6)
		ab, ba, err := Pair(a, b)
		if err != nil {
			t.Fatal(err)
		}
		ab.Ifindex, ba.Ifindex = 1, 1
		if err := s.Install(ab, ba); err != nil {
			t.Fatal(err)
		}
		data := testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, Win: 100, TS: true, TSval: 5, TSecr: 6, Payload: []byte("x")}
		if ret, _ := run(t, s.objs.XlateEth, data); ret != tcActRedirect {
			t.Fatalf("v6=%v: a data segment returned %d, want redirect", v6, ret)
		}
		// A SYN without ACK from peer1's address and port is not.
		syn := testPkt{Src: a.Remote, Dst: a.Local, Seq: 12345, Flags: 0x02, Win: 64240, TS: true, TSval: 9}
		ret, out := run(t, s.objs.XlateEth, syn)
		if ret != tcxNext || out.Src != syn.Src || out.Dst != syn.Dst || out.Seq != syn.Seq {
			t.Errorf("v6=%v: SYN returned %d, %s -> %s seq %d; want next, untouched", v6, ret, out.Src, out.Dst, out.Seq)
		}
		var v xlateEntry
		k := tupleKey(ab.In)
		if err := s.objs.Joins.Lookup(&k, &v); err == nil {
			t.Errorf("v6=%v: the entry the SYN matched is still there", v6)
		}
		if n := s.sweep(monoNow()); n != 1 || s.Stats().Active != 0 {
			t.Errorf("v6=%v: sweep removed %d pairs, %d active; want the pair gone", v6, n, s.Stats().Active)
		}
		rev := testPkt{Src: b.Remote, Dst: b.Local, Seq: b.RcvNxt, Ack: b.SndNxt, Flags: tcpACK, Win: 100, TS: true, TSval: 5, TSecr: 6}
		if ret, _ := run(t, s.objs.XlateEth, rev); ret != tcxNext {
			t.Errorf("v6=%v: after the sweep, the reverse entry still translates (return %d)", v6, ret)
		}
	}
}
