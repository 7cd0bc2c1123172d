//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
)

// TestProgramFreeze: a frozen socket's own packets (egress) keep ack +
// window within the edge latched from the first of them, never raise the
// window of one that offers less, and checksums stay right (decodePkt
// checks them); the freeze says when every byte up to the edge was
// acknowledged. Packets of other tuples are not touched.
func TestProgramFreeze(t *testing.T) {
	s := loadTest(t, 16)
	for _, v6 := range []bool{false, true} {
		_, b := testPair(v6) // b: relay (Local) <-> peer2, relay's window scale 10
		if err := s.freeze(b); err != nil {
			t.Fatal(err)
		}
		ack := func(a uint32, win uint16, payload int) testPkt {
			return testPkt{Src: b.Local, Dst: b.Remote, Seq: 1, Ack: a, Flags: tcpACK, Win: win, TS: true, TSval: 7, TSecr: 8,
				Payload: make([]byte, payload)}
		}
		base := uint32(0xffff_f000) // the edge wraps 2^32
		edge := base + 100<<10
		steps := []struct {
			name    string
			in      testPkt
			wantWin uint16
		}{
			{"first packet latches its edge", ack(base, 100, 0), 100},
			{"a later larger edge is lowered", ack(base+40<<10, 100, 0), 60},
			{"data packets too", ack(base+50<<10, 200, 300), 50},
			{"less than the edge is kept", ack(base+60<<10, 10, 0), 10},
			{"at the edge: zero window", ack(edge, 30, 0), 0},
		}
		for i, st := range steps {
			ret, out := run(t, s.objs.XlateEthEgress, st.in)
			if ret != tcxNext || out.Win != st.wantWin || out.Ack != st.in.Ack || out.Src != st.in.Src {
				t.Errorf("v6=%v %s: return %d, ack %#x window %d; want next, ack %#x window %d", v6, st.name, ret, out.Ack, out.Win, st.in.Ack, st.wantWin)
			}
			_, reached, _ := s.frozenState(b)
			if want := i == len(steps)-1; reached != want {
				t.Errorf("v6=%v after %q: reached %v, want %v", v6, st.name, reached, want)
			}
		}
		// The other direction (peer2's packets arriving) is not frozen.
		in := testPkt{Src: b.Remote, Dst: b.Local, Seq: 1, Ack: 2, Flags: tcpACK, Win: 500}
		if _, out := run(t, s.objs.XlateEthEgress, in); out.Win != 500 {
			t.Errorf("v6=%v: peer2's packet window %d, want 500", v6, out.Win)
		}
		s.thaw(b)
		if _, out := run(t, s.objs.XlateEthEgress, ack(edge+10<<10, 100, 0)); out.Win != 100 {
			t.Errorf("v6=%v: thawed window %d, want 100", v6, out.Win)
		}
		// At the join: the window probe (one byte before snd_una) leaves
		// as a plain ACK; other packets are untouched.
		b.SndNxt = 0 // the probe's seq wraps
		s.fixProbe(b, 0)
		probe := ack(edge, 900, 0)
		probe.Seq = b.SndNxt - 1
		if ret, out := run(t, s.objs.XlateEthEgress, probe); ret != tcxNext || out.Seq != b.SndNxt || out.Win != 900 || out.Ack != edge {
			t.Errorf("v6=%v: probe left with seq %#x window %d ack %#x; want seq %#x window 900 ack %#x", v6, out.Seq, out.Win, out.Ack, b.SndNxt, edge)
		}
		other := ack(edge, 900, 0)
		other.Seq = b.SndNxt
		if _, out := run(t, s.objs.XlateEthEgress, other); out.Seq != b.SndNxt {
			t.Errorf("v6=%v: a plain ACK's seq moved to %#x", v6, out.Seq)
		}
		withData := ack(edge, 900, 1)
		withData.Seq = b.SndNxt - 1
		if _, out := run(t, s.objs.XlateEthEgress, withData); out.Seq != b.SndNxt-1 {
			t.Errorf("v6=%v: a data segment's seq moved to %#x", v6, out.Seq)
		}
		s.thaw(b)
		// A capped first round (Config.FirstRound): the probe's window
		// reaches at most window bytes past rcv_nxt (it wraps 2^32), a
		// smaller one is kept, and only the probe is capped.
		b.RcvNxt = 0xffff_8000
		s.fixProbe(b, 200<<10) // 200 windows of 1 KB (scale 10)
		for _, c := range []struct {
			name          string
			seq           uint32
			payload       int
			win, wantWin  uint16
			wantSeqOffset uint32
		}{
			{"probe above the cap", b.SndNxt - 1, 0, 900, 200, 1},
			{"probe below the cap", b.SndNxt - 1, 0, 150, 150, 1},
			{"plain ACK", b.SndNxt, 0, 900, 900, 0},
			{"data segment", b.SndNxt - 1, 1, 900, 900, 0},
		} {
			p := ack(b.RcvNxt, c.win, c.payload)
			p.Seq = c.seq
			ret, out := run(t, s.objs.XlateEthEgress, p)
			if ret != tcxNext || out.Seq != c.seq+c.wantSeqOffset || out.Win != c.wantWin || out.Ack != b.RcvNxt {
				t.Errorf("v6=%v capped, %s: left with seq %#x window %d ack %#x; want seq %#x window %d ack %#x",
					v6, c.name, out.Seq, out.Win, out.Ack, c.seq+c.wantSeqOffset, c.wantWin, b.RcvNxt)
			}
		}
		s.thaw(b)
	}
}

// TestProgramTailPastEnd: a tail entry's pure ACK that acknowledges past
// the tail (the joined flow's next bytes arrived too, as after a join
// while the sender was still sending) is copied to the tail's socket with
// its ACK lowered to the tail's end (the socket drops an ACK of data it
// never sent, and waited 30 s for its tail), and the packet itself is
// translated with its own ACK, checksums right.
func TestProgramTailPastEnd(t *testing.T) {
	s := loadTest(t, 16)
	a, b := testPair(false)
	ab, ba, err := pairTail(a, b, true, false)
	if err != nil {
		t.Fatal(err)
	}
	ab.Tail, ab.TailEnd = true, a.SndNxt
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.Install(ab, ba); err != nil {
		t.Fatal(err)
	}
	in := testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt + 5000, Flags: tcpACK, Win: 1000, TS: true, TSval: 5, TSecr: 6}
	// The copy goes to the ingress of the test run's device (lo): run it
	// in a namespace of its own.
	l := xlatetest.NewLoopback(t, false)
	var ret uint32
	var out testPkt
	xlatetest.MustIn(t, l.R, func() (err error) { ret, out, err = runPkt(s.objs.XlateEth, in); return err })
	if ret != tcActRedirect || out.Ack != b.RcvNxt+5000 || out.Dst != b.Remote {
		t.Errorf("return %d, ack %#x to %s; want redirect, ack %#x to %s", ret, out.Ack, out.Dst, b.RcvNxt+5000, b.Remote)
	}
	if st := s.Stats(); st.Errors != 0 || st.Tail+st.Errors == 0 && st.Packets != 1 {
		t.Errorf("stats %+v", st)
	}
	// The copy: the tail flag is gone once an ACK covered it.
	var v xlateEntry
	k := tupleKey(ab.In)
	if err := s.objs.Joins.Lookup(&k, &v); err != nil || v.Flags&fTail != 0 {
		t.Errorf("entry flags %#x (%v); want the tail flag cleared", v.Flags, err)
	}
}

// TestTailReadyCountsLeft: a join near a frozen edge counts the bytes the
// sender may still send with the tail (both cross the out-leg's path after
// the join).
func TestTailReadyCountsLeft(t *testing.T) {
	in := SockState{MinRTT: 50 * time.Millisecond}
	out := SockState{Unsent: 600_000, DeliveryRate: 24_000_000} // 25 ms of the flow
	if !tailReady(in, out, 0) {
		t.Error("a 25 ms tail on a 50 ms leg: not ready")
	}
	if tailReady(in, out, 1_000_000) {
		t.Error("a 25 ms tail plus 42 ms still to come from the sender: ready (the path would carry both at once)")
	}
}

// TestProgramFreezeOOO: a frozen socket's packets tell whether it holds
// data out of order: a SACK block past the packet's ACK (1-4 blocks, also
// across 2^32) sets the freeze's ooo flag, a packet without one (or with
// only a D-SACK block below its ACK) clears it.
func TestProgramFreezeOOO(t *testing.T) {
	s := loadTest(t, 16)
	s.cfg.Freeze = true // oooHeld reads the flag
	for _, v6 := range []bool{false, true} {
		_, b := testPair(v6)
		if err := s.freeze(b); err != nil {
			t.Fatal(err)
		}
		base := uint32(0xffff_ff00)
		ack := func(sack ...[2]uint32) testPkt {
			return testPkt{Src: b.Local, Dst: b.Remote, Seq: 1, Ack: base, Flags: tcpACK, Win: 100, TS: true, TSval: 7, TSecr: 8, SACK: sack}
		}
		// (Four blocks leave no room for the timestamps.)
		noTS := func(p testPkt) testPkt { p.TS = false; return p }
		steps := []struct {
			name string
			in   testPkt
			want bool
		}{
			{"no SACK", ack(), false},
			{"one block past the ACK (wraps)", ack([2]uint32{base + 1000, base + 3000}), true},
			{"the hole filled", ack(), false},
			{"D-SACK below the ACK", ack([2]uint32{base - 2000, base - 1000}), false},
			{"D-SACK, then a block past the ACK", ack([2]uint32{base - 2000, base - 1000}, [2]uint32{base + 500, base + 900}), true},
			{"D-SACK alone again", ack([2]uint32{base - 2000, base - 1000}), false},
			{"four blocks, the last past the ACK", noTS(ack([2]uint32{base - 900, base - 800}, [2]uint32{base - 700, base - 600},
				[2]uint32{base - 500, base - 400}, [2]uint32{base + 10, base + 20})), true},
			{"three blocks below", ack([2]uint32{base - 900, base - 800}, [2]uint32{base - 700, base - 600}, [2]uint32{base - 500, base - 400}), false},
		}
		for _, st := range steps {
			if ret, _ := run(t, s.objs.XlateEthEgress, st.in); ret != tcxNext {
				t.Errorf("v6=%v %s: return %d", v6, st.name, ret)
			}
			var v xlateFreeze
			k := freezeKey(b)
			if err := s.objs.Freezes.Lookup(&k, &v); err != nil {
				t.Fatal(err)
			}
			if got := v.Ooo != 0; got != st.want {
				t.Errorf("v6=%v %s: ooo %v, want %v", v6, st.name, got, st.want)
			}
			// (With bytes forwarded: only the flag can tell.)
			if got := s.oooHeld(b, SockState{}, 1) != ""; got != st.want {
				t.Errorf("v6=%v %s: oooHeld %v, want %v", v6, st.name, got, st.want)
			}
		}
		s.thaw(b)
	}
}
