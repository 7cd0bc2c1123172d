package ttsbench

import "testing"

func TestParseCounters(t *testing.T) {
	in := "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RetransSegs\nTcp: 1 42\nUdp: InDatagrams\nUdp: 5\n" +
		"TcpExt: SyncookiesSent TCPTimeouts TCPSpuriousRTOs\nTcpExt: 0 3 1\nIpExt: InNoRoutes\nIpExt: 0\n"
	m := parseCounters(in)
	want := map[string]int64{"RtoAlgorithm": 1, "RetransSegs": 42, "SyncookiesSent": 0, "TCPTimeouts": 3, "TCPSpuriousRTOs": 1}
	if len(m) != len(want) {
		t.Errorf("parseCounters = %v; want %v", m, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %d; want %d", k, m[k], v)
		}
	}
	b := map[string]map[string]int64{"s": m}
	a := map[string]map[string]int64{"s": {"RetransSegs": 50, "TCPTimeouts": 3, "TCPSpuriousRTOs": 2}}
	d := kernelDelta(b, a)
	if len(d["s"]) != 2 || d["s"]["RetransSegs"] != 8 || d["s"]["TCPSpuriousRTOs"] != 1 {
		t.Errorf("kernelDelta = %v; want RetransSegs 8, TCPSpuriousRTOs 1", d)
	}
	if kernelDelta(nil, a) != nil {
		t.Error("kernelDelta without a first snapshot: want nil")
	}
}
