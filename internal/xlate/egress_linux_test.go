//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"bytes"
	"testing"
	"time"
)

// TestProgramEgress: the surrogate-side placement with BPF_PROG_TEST_RUN.
// The router's host installs the pair with the surrogate -> router
// direction Remote: a surrogate packet that still reaches the router is
// translated with its TSval delta TSBack lower, and counted. The surrogate's
// host installs that direction alone (InstallEgress) and its egress
// program turns the surrogate's own packet into the router's packet to the
// client: addresses, seq/ack/SACK, window scale, TSval on the client leg's
// clock (TSecr 0: the reverse delta lives on the router's host).
func TestProgramEgress(t *testing.T) {
	rr := loadTest(t, 16)
	a, b := testPair(false) // a: router <-> client, b: router <-> surrogate
	ab, ba, err := Pair(a, b)
	if err != nil {
		t.Fatal(err)
	}
	ab.Ifindex, ba.Ifindex = 1, 1
	remote := ba
	remote.Remote, remote.TSBack = true, 50
	if err := rr.Install(ab, remote); err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("r"), 300)
	fromSur := testPkt{Src: b.Remote, Dst: b.Local, Seq: b.RcvNxt, Ack: b.SndNxt, Flags: tcpACK | tcpPSH, Win: 500,
		TS: true, TSval: 424242, TSecr: 1, SACK: [][2]uint32{{b.SndNxt + 0x10, b.SndNxt + 0x20}}, Payload: payload}
	// A surrogate packet that still reaches the router (sent before the
	// agent's install) is translated there, its TSval delta latched
	// TSBack ms lower (as at its send time), and counted.
	before := uint32(monoNow()/time.Millisecond) + a.TSOffset - 50
	ret, out := run(t, rr.objs.XlateEth, fromSur)
	after := uint32(monoNow()/time.Millisecond) + a.TSOffset + 1 - 50
	if ret != tcActRedirect || out.Src != a.Local || out.Dst != a.Remote || out.Seq != a.SndNxt {
		t.Errorf("remote entry at the router: return %d, %+v; want translated", ret, out)
	}
	if out.TSval-before > after-before {
		t.Errorf("remote entry's TSval %d outside [%d, %d] (latched TSBack lower)", out.TSval, before, after)
	}
	run(t, rr.objs.XlateEth, testPkt{Src: b.Remote, Dst: b.Local, Seq: b.RcvNxt, Ack: b.SndNxt, Flags: tcpACK, TS: true, TSval: 424242})
	if st := rr.Stats(); st.Remote != 2 || st.RemoteData != 1 || st.Packets != 2 {
		t.Errorf("router counters %+v; want 2 remote packets, 1 with data, both translated", st)
	}
	// The client -> surrogate direction still translates at the router.
	if ret, _ := run(t, rr.objs.XlateEth, testPkt{Src: a.Remote, Dst: a.Local, Seq: a.RcvNxt, Ack: a.SndNxt, Flags: tcpACK, TS: true, TSval: 9}); ret != tcActRedirect {
		t.Errorf("client -> surrogate at the router: return %d, want redirect", ret)
	}
	// The surrogate's host.
	sur := loadTest(t, 16)
	if err := sur.InstallEgress(ba); err != nil {
		t.Fatal(err)
	}
	// A second install of the tuple replaces the first.
	if err := sur.InstallEgress(ba); err != nil || sur.Stats().Singles != 1 {
		t.Errorf("second InstallEgress of the same tuple: %v, %d singles; want it replaced", err, sur.Stats().Singles)
	}
	before = uint32(monoNow()/time.Millisecond) + a.TSOffset
	ret, out = run(t, sur.objs.XlateEthEgress, fromSur)
	after = uint32(monoNow()/time.Millisecond) + a.TSOffset + 1
	if ret != tcActRedirect {
		t.Fatalf("egress: return %d, want redirect", ret)
	}
	if out.Src != a.Local || out.Dst != a.Remote {
		t.Errorf("egress addresses %s->%s, want %s->%s (the router's to the client)", out.Src, out.Dst, a.Local, a.Remote)
	}
	if out.Seq != a.SndNxt || out.Ack != a.RcvNxt {
		t.Errorf("egress seq/ack %#x/%#x, want %#x/%#x", out.Seq, out.Ack, a.SndNxt, a.RcvNxt)
	}
	if len(out.SACK) != 1 || out.SACK[0] != [2]uint32{a.RcvNxt + 0x10, a.RcvNxt + 0x20} {
		t.Errorf("egress SACK %#x", out.SACK)
	}
	if want := uint16(500 << b.SndWScale >> a.RcvWScale); out.Win != want {
		t.Errorf("egress window %d, want %d", out.Win, want)
	}
	if out.TSval-before > after-before || out.TSecr != 0 {
		t.Errorf("egress TSval %d (want in [%d, %d]), TSecr %d (want 0)", out.TSval, before, after, out.TSecr)
	}
	if !bytes.Equal(out.Payload, payload) {
		t.Error("payload changed")
	}
	st := sur.Stats()
	if st.Egress != 1 || st.Packets != 1 || st.Bytes != uint64(len(payload)) || st.Singles != 1 {
		t.Errorf("surrogate counters %+v; want 1 packet of %d bytes at egress, 1 single entry", st, len(payload))
	}
	// Another packet of the surrogate's host: not ours.
	if ret, _ := run(t, sur.objs.XlateEthEgress, testPkt{Src: b.Remote, Dst: ap("10.2.0.2:50001"), Seq: 1, Flags: tcpACK}); ret != tcxNext {
		t.Errorf("unrelated egress packet: return %d, want TCX_NEXT", ret)
	}
	// A FIN is recorded; the sweep removes the entry after CloseLinger
	// (0 in this unattached splicer).
	run(t, sur.objs.XlateEthEgress, testPkt{Src: b.Remote, Dst: b.Local, Seq: b.RcvNxt + 300, Ack: b.SndNxt, Flags: tcpACK | tcpFIN, TS: true, TSval: 424250})
	if e, ok := sur.Entry(ba.In); !ok || !e.FIN || e.Packets != 2 {
		t.Errorf("egress entry %+v %v; want 2 packets, FIN", e, ok)
	}
	if n := sur.sweep(monoNow() + time.Millisecond); n != 1 || sur.Stats().Singles != 0 {
		t.Errorf("sweep removed %d, singles %d; want the closed entry gone", n, sur.Stats().Singles)
	}
	if sur.RemoveEgress(ba.In) {
		t.Error("RemoveEgress of a swept entry reported true")
	}

	// Released (the agent refused or is gone): no longer counted as remote.
	if !rr.Release(ba.In) {
		t.Fatal("Release failed")
	}
	ret, out = run(t, rr.objs.XlateEth, fromSur)
	if st := rr.Stats(); ret != tcActRedirect || out.Src != a.Local || st.Remote != 2 {
		t.Errorf("released: return %d, %+v, counters %+v; want translated at the router, not counted remote", ret, out, st)
	}
	if rr.Release(Tuple{Src: ap("10.9.9.9:1"), Dst: ap("10.9.9.8:2")}) {
		t.Error("Release of an unknown tuple reported true")
	}
}
