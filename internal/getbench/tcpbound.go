package getbench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// TCP segment arithmetic of TCPBound: 1448 payload bytes per 1500-byte
// packet (the emulator's rates count IP bytes), an initial window of 10
// segments.
const (
	mss       = 1448
	mtu       = 1500
	initCwnd  = 10
	roundTrip = 2 // round trips before the first byte: handshake, request
)

// TCPBound returns the least time any TCP client on fresh connections
// needs for size bytes from sources at rates mbit (Mbit/s of IP bytes) and
// round-trip times rtt, the sources ending together: each source's payload
// rate is mbit x 1448/1500; its first byte comes 2 RTTs after the start
// (handshake, request); its congestion window starts at 10 segments and
// doubles per RTT, under-delivering (BDP - cwnd) per round until it
// reaches the bandwidth-delay product. The bound is (size + the bytes not
// delivered during the waits and slow starts) / the sum of payload rates.
func TCPBound(size int64, mbit []float64, rtt []time.Duration) float64 {
	var rate, lost float64
	for i, m := range mbit {
		r := m * 1e6 / 8 * mss / mtu
		bdp := r * rtt[i].Seconds()
		lost += r * roundTrip * rtt[i].Seconds()
		for c := float64(initCwnd * mss); c < bdp; c *= 2 {
			lost += bdp - c
		}
		rate += r
	}
	if rate == 0 {
		return 0
	}
	return (float64(size) + lost) / rate
}

// subflowRTTs returns, per multisource source, the median RTT the mosto get
// downloads of scenario sc measured on its sub-flow; ok is false when a
// source has none.
func subflowRTTs(rs []Result, sc string) ([]time.Duration, bool) {
	per := make([][]float64, len(sources))
	for _, r := range rs {
		if r.Scenario != sc || r.Mode != "mosto get" || r.Err != "" || r.Stats == nil || len(r.Stats.Subflows) != len(sources) {
			continue
		}
		for i, s := range r.Stats.Subflows {
			if s.RTTms > 0 {
				per[i] = append(per[i], s.RTTms)
			}
		}
	}
	out := make([]time.Duration, len(sources))
	for i, xs := range per {
		if len(xs) == 0 {
			return nil, false
		}
		slices.Sort(xs)
		out[i] = time.Duration(xs[len(xs)/2] * float64(time.Millisecond))
	}
	return out, true
}

func sourceMbit() []float64 {
	var m []float64
	for _, s := range sources {
		m = append(m, s.mbit)
	}
	return m
}

// msList formats durations as "38/55/44" (milliseconds).
func msList(ds []time.Duration) string {
	var ss []string
	for _, d := range ds {
		ss = append(ss, fmt.Sprintf("%.0f", d.Seconds()*1e3))
	}
	return strings.Join(ss, "/")
}
