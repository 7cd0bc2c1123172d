//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"encoding/binary"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A drain pace caps the pacing of the relay's socket toward a receiver
// during a frozen handover (Config.DrainPace), so that the queue the
// relay's own sender keeps on that path is gone by the time the resumed
// sender's first joined round arrives there.
//
// Why (Fig. 3, session 13): a BBR relay socket keeps about 19 ms of a
// 20 ms bottleneck queue full; the resumed sender's first round after the
// join (its whole window, with the tail's last bytes or a 1.25x ProbeBW
// phase on top) then overflowed that queue, and a lost packet of the
// joined flow is resent one end-to-end RTT later: a ~100 ms stall at
// 100 ms. Paced slightly below the rate it delivers at, the relay's socket
// sends less than the bottleneck drains, so the standing queue empties
// while the handover relays up to the frozen edge (TCP's internal pacing:
// no qdisc needed).
type drainPace struct {
	fd  int
	old uint64 // SO_MAX_PACING_RATE before
}

// paceRate is the rate a socket delivers at (bytes/s): BBR's bandwidth
// estimate (its max filter over the last rounds; a single delivery-rate
// sample can fall in a drain or probe phase) when the socket runs BBR, else
// its latest delivery-rate sample; 0 when the kernel does not say.
func paceRate(fd int, st SockState) uint64 {
	if bw := bbrBandwidth(fd); bw > 0 {
		return bw
	}
	return st.DeliveryRate
}

// bbrBandwidth reads a BBR socket's bandwidth estimate (TCP_CC_INFO,
// struct tcp_bbr_info: bw_lo, bw_hi, ...; bytes/s), 0 for another
// congestion control.
func bbrBandwidth(fd int) uint64 {
	cc, err := unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil || !strings.HasPrefix(cc, "bbr") {
		return 0
	}
	var info [20]byte
	n := uint32(len(info))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_CC_INFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0); e != 0 || n < 8 {
		return 0
	}
	ne := binary.NativeEndian
	return uint64(ne.Uint32(info[4:]))<<32 | uint64(ne.Uint32(info[0:]))
}

// startDrainPace caps fd's pacing at frac of rate (bytes/s). ok is false
// when nothing was set (no rate, or the kernel refused).
func startDrainPace(fd int, rate uint64, frac float64) (p drainPace, ok bool) {
	if rate == 0 || frac <= 0 {
		return p, false
	}
	old, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE)
	if err != nil {
		return p, false
	}
	want := max(uint64(float64(rate)*frac), 1)
	if old != 0 && old < want {
		return p, false // already paced lower
	}
	if unix.SetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, want) != nil {
		return p, false
	}
	return drainPace{fd: fd, old: old}, true
}

// stop gives the socket its cap back (a refused handover resumes the
// relayed flow at its own pace). The kernel leaves its internal pacing
// on for a socket whose cap was ever set (a CUBIC socket then paces at
// its cwnd/srtt rate, BBR paces anyway).
func (p drainPace) stop() {
	unix.SetsockoptUint64(p.fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, p.old)
}
