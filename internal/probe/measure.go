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
				return 0, fmt.Errorf("probe %s: no reply within %v: %w", addr, timeout, ctx.Err())
			}
			return 0, fmt.Errorf("probe %s: %w", addr, err)
		}
		p, err := ParsePacket(buf[:n])
		if err != nil || p.Type != TypeReply || p.ID != req.ID || p.Seq != req.Seq || p.Stamp != req.Stamp {
			continue // stray datagram: keep waiting
		}
		if _, ok := Verify(buf[:n], keys); !ok {
			continue // forged, or under a key we do not know: keep waiting
		}
		if kernel {
			if k := rxTimestamp(oob[:oobn]); k != 0 {
				if d := time.Duration(k - start.UnixNano()); d > 0 && d <= raw {
					raw = d
				}
			}
		}
		if turn := time.Duration(p.Turnaround()); turn > 0 && turn < raw {
			raw -= turn
		}
		return raw, nil
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
