package probe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// UDPEcho measures the RTT to a peer's measurement endpoint with one echo
// round trip per call, TWAMP-like: the reply carries the responder's
// receive and send times, and its turnaround (send - receive, on its
// clock) is subtracted. The reply's arrival time is the kernel's
// (SO_TIMESTAMPNS) where available, so neither end's scheduling latency is
// measured. The zero value is ready to use.
type UDPEcho struct {
	Timeout time.Duration // per round trip; 0 means 2s
	// Dial, if set, opens the UDP socket (e.g. inside a network namespace);
	// nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Keys returns the overlay keys: requests are tagged under the first
	// and only replies tagged under one of them count. Nil or none:
	// untagged requests and replies.
	Keys func() []Key
	seq  atomic.Uint64
	// starve, if set, runs between sending the request and reading the
	// reply (tests: the process is not scheduled meanwhile).
	starve func()
}

// Measure sends one request to addr and returns the time to its reply less
// the responder's turnaround.
func (u *UDPEcho) Measure(ctx context.Context, addr string) (time.Duration, error) {
	timeout := u.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := u.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	var keys []Key
	if u.Keys != nil {
		keys = u.Keys()
	}
	c, err := dial(ctx, "udp", addr)
	if err != nil {
		return 0, fmt.Errorf("probe %s: %w", addr, err)
	}
	defer c.Close()
	uc, _ := c.(*net.UDPConn)
	kernel := uc != nil && enableRxTimestamps(uc)
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var idb [8]byte
	rand.Read(idb[:])
	req := Packet{Type: TypeRequest, ID: binary.BigEndian.Uint64(idb[:]), Seq: u.seq.Add(1)}
	var key *Key
	if len(keys) > 0 {
		key = &keys[0]
		req.KeyID = key.ID
	}
	start := time.Now()
	req.Stamp = uint64(start.UnixNano())
	b, err := req.Append(make([]byte, 0, PacketSize), key)
	if err != nil {
		return 0, fmt.Errorf("probe %s: %w", addr, err)
	}
	start = time.Now()
	if _, err := c.Write(b); err != nil {
		return 0, fmt.Errorf("probe %s: %w", addr, err)
	}
	buf := make([]byte, PacketSize+1)
	oob := make([]byte, oobSize)
	// match returns the RTT if b is the reply to req; raw is the time to
	// its arrival as this process saw it, oob its control messages.
	match := func(b, oob []byte, raw time.Duration) (time.Duration, bool) {
		p, err := ParsePacket(b)
		if err != nil || p.Type != TypeReply || p.ID != req.ID || p.Seq != req.Seq || p.Stamp != req.Stamp {
			return 0, false // stray datagram: keep waiting
		}
		if _, ok := Verify(b, keys); !ok {
			return 0, false // forged, or under a key we do not know: keep waiting
		}
		if kernel {
			if k := rxTimestamp(oob); k != 0 {
				if d := time.Duration(k - start.UnixNano()); d > 0 && d <= raw {
					raw = d
				}
			}
		}
		if turn := time.Duration(p.Turnaround()); turn > 0 && turn < raw {
			raw -= turn
		}
		return raw, true
	}
	if u.starve != nil {
		u.starve() // test hook: this process is not scheduled for a while
	}
	for {
		var n, oobn int
		if kernel {
			n, oobn, _, _, err = uc.ReadMsgUDPAddrPort(buf, oob)
		} else {
			n, err = c.Read(buf)
		}
		raw := time.Since(start)
		if err != nil {
			if ctx.Err() != nil {
				if kernel && ctx.Err() == context.DeadlineExceeded {
					if d, ok := queuedReply(uc, buf, oob, start, timeout, match); ok {
						return d, nil
					}
				}
				return 0, fmt.Errorf("probe %s: no reply within %v: %w", addr, timeout, ctx.Err())
			}
			return 0, fmt.Errorf("probe %s: %w", addr, err)
		}
		if d, ok := match(buf[:n], oob[:oobn], raw); ok {
			return d, nil
		}
	}
}

// queuedReply looks, once the timeout passed, at the datagrams already
// queued on uc without waiting: a reply the kernel stamped within the
// timeout counts. The timeout then ran out because this process was not
// scheduled to read it (a loaded machine, the race detector), not because
// the path lost or delayed it; counting it as lost made a starved FEP
// report live peers unreachable. The RTT is the kernel's arrival time less
// the send time, so the late read is not measured.
func queuedReply(uc *net.UDPConn, buf, oob []byte, start time.Time, timeout time.Duration, match func(b, oob []byte, raw time.Duration) (time.Duration, bool)) (time.Duration, bool) {
	if uc.SetReadDeadline(time.Time{}) != nil {
		return 0, false
	}
	for {
		n, oobn, ok := readQueued(uc, buf, oob)
		if !ok {
			return 0, false
		}
		k := rxTimestamp(oob[:oobn])
		if k == 0 {
			continue
		}
		raw := time.Duration(k - start.UnixNano())
		if raw <= 0 || raw > timeout {
			continue
		}
		if d, ok := match(buf[:n], oob[:oobn], raw); ok {
			return d, true
		}
	}
}

// TCPHandshake measures the RTT to a peer as the time a TCP connect to addr
// (its hop port) takes: SYN out, SYN-ACK back. It needs nothing from the
// peer but a listener, at the cost of an accepted-and-closed connection.
type TCPHandshake struct {
	Timeout time.Duration // 0 means 2s
}

// Measure connects to addr, closes the connection and returns the connect time.
func (t TCPHandshake) Measure(ctx context.Context, addr string) (time.Duration, error) {
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	d := net.Dialer{Timeout: timeout}
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", addr)
	rtt := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("probe tcp %s: %w", addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // no TIME_WAIT pile-up at one probe per interval per peer
	}
	c.Close()
	return rtt, nil
}

// errNoSample is returned by a round in which every probe to a peer failed.
var errNoSample = errors.New("probe: no successful measurement")
