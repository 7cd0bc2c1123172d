package emu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Samples is a set of duration measurements.
type Samples []time.Duration

// Min returns the smallest sample, or 0.
func (s Samples) Min() time.Duration {
	if len(s) == 0 {
		return 0
	}
	return slices.Min(s)
}

// Median returns the median sample, or 0.
func (s Samples) Median() time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return c[len(c)/2]
}

// Ping sends count ICMP echo requests from host from to host to, one every
// interval, and returns the round-trip times of the replies. It runs on a
// locked thread with real-time priority, so that its own wake-up on a busy
// machine does not count as network delay.
func (w *World) Ping(ctx context.Context, from, to string, count int, interval time.Duration) (Samples, error) {
	dst := w.Addr(to)
	if !dst.IsValid() {
		return nil, fmt.Errorf("emu: ping: unknown host %q", to)
	}
	var out Samples
	err := w.Do(from, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		defer unix.Close(fd)
		tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		sa := &unix.SockaddrInet4{Addr: dst.As4()}
		buf := make([]byte, 1500)
		timeout := 2*w.RTT(from, to) + time.Second
		return w.measuring(func() error {
			for seq := range count {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				req := make([]byte, 16)
				req[0] = 8 // echo request
				binary.BigEndian.PutUint16(req[6:], uint16(seq))
				sent := time.Now()
				if err := unix.Sendto(fd, req, 0, sa); err != nil {
					return fmt.Errorf("send: %w", err)
				}
				for time.Since(sent) < timeout {
					n, _, err := unix.Recvfrom(fd, buf, 0)
					if err != nil {
						if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
							continue
						}
						return fmt.Errorf("recv: %w", err)
					}
					if n >= 8 && buf[0] == 0 && binary.BigEndian.Uint16(buf[6:]) == uint16(seq) {
						out = append(out, time.Since(sent))
						break
					}
				}
				if seq < count-1 {
					time.Sleep(interval)
				}
			}
			return nil
		})
	})
	if err != nil {
		return out, fmt.Errorf("emu: ping %s->%s: %w", from, to, err)
	}
	if len(out) == 0 {
		return nil, errors.New("emu: ping: no replies")
	}
	return out, nil
}

// measuring runs fn on the calling locked thread with real-time priority
// and restores normal priority afterwards. Unlike the emulator's threads
// (UpOptions.Realtime), a measuring thread wakes only once per probe, so
// the priority costs nothing and keeps its own wake-up out of the result.
func (w *World) measuring(fn func() error) error {
	rt := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 5}
	if unix.SchedSetAttr(0, rt, 0) != nil {
		return fn()
	}
	defer unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0)
	return fn()
}

// ConnectRTT measures count TCP handshakes from host from to a listener in
// host to (the time connect(2) takes).
func (w *World) ConnectRTT(ctx context.Context, from, to string, count int) (Samples, error) {
	l, err := w.Listen(ctx, to, "tcp4", net.JoinHostPort(w.Addr(to).String(), "0"))
	if err != nil {
		return nil, err
	}
	defer l.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer l.Close()
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	port := l.Addr().(*net.TCPAddr).Port
	sa := &unix.SockaddrInet4{Port: port, Addr: w.Addr(to).As4()}
	var out Samples
	for range count {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		// A blocking connect(2) on this locked thread: the kernel wakes it
		// directly, without the Go netpoller's scheduling delay.
		var d time.Duration
		err := w.Do(from, func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return w.measuring(func() error {
				start := time.Now()
				if err := unix.Connect(fd, sa); err != nil {
					return fmt.Errorf("connect: %w", err)
				}
				d = time.Since(start)
				return nil
			})
		})
		if err != nil {
			return out, fmt.Errorf("emu: handshake %s->%s: %w", from, to, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// Fetch measures a download over an established TCP connection: client
// connects to a server in host server, then sends a one-byte request; the
// server answers with size bytes and closes. The result is the time from
// sending the request to receiving the last byte, so the ideal is one RTT
// plus size/rate, with no handshake. SteadyMbit is the goodput over the
// second half of the bytes, after slow start.
func (w *World) Fetch(ctx context.Context, client, server string, size int64) (FetchResult, error) {
	var res FetchResult
	l, err := w.Listen(ctx, server, "tcp4", net.JoinHostPort(w.Addr(server).String(), "0"))
	if err != nil {
		return res, err
	}
	defer l.Close()
	srvErr := make(chan error, 1)
	srvDone := false
	defer func() {
		// Stop and wait for the server on every path.
		l.Close()
		if !srvDone {
			<-srvErr
		}
	}()
	go func() {
		c, err := l.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		var req [1]byte
		if _, err := io.ReadFull(c, req[:]); err != nil {
			srvErr <- fmt.Errorf("read request: %w", err)
			return
		}
		_, err = io.CopyN(c, zeroReader{}, size)
		srvErr <- err
	}()
	c, err := w.Dial(ctx, client, "tcp4", l.Addr().String())
	if err != nil {
		return res, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	start := time.Now()
	if _, err := c.Write([]byte{1}); err != nil {
		return res, fmt.Errorf("emu: fetch: %w", err)
	}
	buf := make([]byte, 256<<10)
	var n int64
	var half time.Time
	for {
		k, err := c.Read(buf)
		n += int64(k)
		if half.IsZero() && n >= size/2 {
			half = time.Now()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, fmt.Errorf("emu: fetch: %w", err)
		}
	}
	end := time.Now()
	res.Time = end.Sub(start)
	srvDone = true
	if err := <-srvErr; err != nil {
		return res, fmt.Errorf("emu: fetch: server: %w", err)
	}
	if n != size {
		return res, fmt.Errorf("emu: fetch: received %d of %d bytes", n, size)
	}
	if d := end.Sub(half); d > 0 {
		res.SteadyMbit = float64(size-size/2) * 8 / d.Seconds() / 1e6
	}
	return res, nil
}

// FetchResult is what Fetch measured.
type FetchResult struct {
	Time       time.Duration // request sent to last byte received
	SteadyMbit float64       // goodput over the second half of the bytes
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// UDPLoss sends count datagrams of size bytes from host from to host to,
// paced at gap, and returns how many arrived and how many arrived after a
// later-sent one (reordered).
func (w *World) UDPLoss(ctx context.Context, from, to string, count, size int, gap time.Duration) (int, int, error) {
	rc, err := w.ListenPacket(ctx, to, "udp4", net.JoinHostPort(w.Addr(to).String(), "0"))
	if err != nil {
		return 0, 0, err
	}
	// A receiver starved on a loaded machine must not lose datagrams in
	// its socket buffer: that loss is not the emulator's (a run at load 40
	// counted 1752 of 3000 lost on a 10% link). SO_RCVBUF is capped by
	// net.core.rmem_max (about 200 datagrams); as root, force 8 MiB.
	rc.(*net.UDPConn).SetReadBuffer(8 << 20)
	if raw, err := rc.(*net.UDPConn).SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) })
	}
	var received, reordered int
	var lastRecv atomic.Int64
	lastRecv.Store(time.Now().UnixNano())
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		last := -1
		for {
			n, _, err := rc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 4 {
				continue
			}
			seq := int(binary.BigEndian.Uint32(buf))
			if seq < last {
				reordered++
			}
			last = max(last, seq)
			received++
			lastRecv.Store(time.Now().UnixNano())
		}
	}()
	defer func() {
		rc.Close()
		<-done
	}()
	sc, err := w.ListenPacket(ctx, from, "udp4", net.JoinHostPort(w.Addr(from).String(), "0"))
	if err != nil {
		return 0, 0, err
	}
	defer sc.Close()
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(w.Addr(to), uint16(rc.LocalAddr().(*net.UDPAddr).Port)))
	msg := make([]byte, max(size, 4))
	next := time.Now()
	for i := range count {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		binary.BigEndian.PutUint32(msg, uint32(i))
		if _, err := sc.WriteTo(msg, dst); err != nil {
			return 0, 0, fmt.Errorf("emu: udp send: %w", err)
		}
		next = next.Add(gap)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
	}
	// Wait until nothing arrived for a while: under load the emulator may
	// lag behind the sender.
	quiet := 2*w.RTT(from, to) + 300*time.Millisecond
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if time.Since(time.Unix(0, lastRecv.Load())) > quiet {
			break
		}
	}
	rc.Close()
	<-done
	return received, reordered, nil
}

// ms formats a duration in milliseconds with two decimals.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64)
}
