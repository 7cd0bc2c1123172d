package evloop

import (
	"errors"
	"io"
	"net/netip"
	"time"
)

// Outcome is how a flow ended.
type Outcome uint8

const (
	// OK: both directions reached EOF and every byte was passed on.
	OK Outcome = iota
	// Reset: a read, write or shutdown failed on either side (a reset, a
	// broken pipe); both sides were closed with an RST.
	Reset
	// Idle: neither direction moved for Config.Idle; both sides were reset.
	Idle
	// ConnectFailed: the upstream could not be connected (after every
	// Retry); the client was reset and no byte of it was sent.
	ConnectFailed
	// Aborted: ResetAll ended the flow.
	Aborted
	// Incomplete: a Head the handler asked more of (ErrMore) did not come
	// whole: the wait ran out (the error is os.ErrDeadlineExceeded), the
	// client closed (io.EOF if it sent nothing since the head's wait began,
	// else io.ErrUnexpectedEOF) or the head outgrew a buffer
	// (ErrHeadTooLarge). The client was reset, except after io.EOF (a
	// plain close).
	Incomplete
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Reset:
		return "reset"
	case Idle:
		return "idle"
	case ConnectFailed:
		return "connect_failed"
	case Aborted:
		return "aborted"
	case Incomplete:
		return "incomplete"
	}
	return "unknown"
}

// Config tunes the loops.
type Config struct {
	// Loops is the number of event loops (OS threads); 0: 1.
	Loops int
	// Idle ends a flow when neither direction moved for this long; 0: never.
	Idle time.Duration
	// ConnectTimeout bounds an upstream's handshake; 0: 10 s.
	ConnectTimeout time.Duration
	// BufSize is the size of each direction's buffer, taken only while the
	// direction has bytes in flight; 0: 16 KiB.
	BufSize int
	// Bulk hands a flow to Handler.Handover once one read fills a whole
	// buffer (and neither direction has ended); false keeps every flow.
	Bulk bool
	// AcceptBatch bounds the connections one loop accepts per wakeup; 0: 16.
	AcceptBatch int
	// NoFINMerge sends a direction's last bytes and its FIN as separate
	// segments. By default the last write before a FIN that follows at
	// once (the source already ended) uses MSG_MORE, so the shutdown or
	// close sends data and FIN in one segment: a short flow costs the
	// relay and its peers one segment less each way.
	NoFINMerge bool
}

func (c Config) withDefaults() Config {
	c.Loops = max(c.Loops, 1)
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if c.BufSize <= 0 {
		c.BufSize = 16 << 10
	}
	if c.AcceptBatch <= 0 {
		c.AcceptBatch = 16
	}
	return c
}

// Upstream is the other side of a flow, chosen by the Handler.
type Upstream struct {
	// FD is a nonblocking TCP socket: connecting (see Dial) unless
	// Connected. The flow owns it from now on.
	FD int
	// Conn, if set, owns FD (a pooled connection): the flow closes Conn
	// instead of FD, and hands it over as is.
	Conn io.Closer
	// Connected: FD is established already (pooled).
	Connected bool
	// Prefix is sent upstream before the client's bytes (a hop or PROXY
	// header). The loop does not keep a reference after the flow ends.
	Prefix []byte
	// FastOpen: FD was set up with TCP_FASTOPEN_CONNECT, so connect
	// returned at once and the first write sends the SYN (with data if a
	// cookie is cached). The loop writes as soon as it has bytes but keeps
	// them until the handshake is confirmed (TCP_INFO), so a SYN refused or
	// dropped can still be retried with every byte.
	FastOpen bool
	// Wait: no upstream yet (FD is ignored). The loop waits up to Wait for
	// the client's first bytes (or its EOF), then asks Handler.Dial, so the
	// bytes can ride in a Fast Open SYN. Dial may answer another Wait: a
	// new wait (new deadline) begins, and Dial is asked again at once if
	// client bytes are left.
	Wait time.Duration
	// Head (with Wait): the client's first bytes are a head (a header, a
	// handshake) the handler must see whole before it picks the upstream.
	// Dial is called each time more bytes arrived and may answer ErrMore to
	// have the loop read on, under the same deadline, up to one buffer
	// (Config.BufSize). Dial is never called for a head with nothing new:
	// if the wait runs out, the client closes or the buffer fills first,
	// the flow ends as Incomplete.
	Head bool
	// Consume (from Dial): the first Consume client bytes read so far were
	// the head; they are dropped, not sent upstream nor counted. The rest
	// follow the Prefix.
	Consume int
	// Reply (from Dial): bytes written to the client at once, before
	// anything else (a handshake's answer, not counted in Stats.Down). It
	// must fit the client socket's send buffer: a short write resets the
	// flow.
	Reply []byte
	// Retry: if the upstream fails before any byte was written to it
	// (connect refused or timed out, or the first write failed), the loop
	// asks Handler.Retry for another one instead of failing the flow.
	Retry bool
}

// Stats are a flow's figures so far.
type Stats struct {
	Up, Down int64         // client bytes passed upstream, upstream bytes passed to the client
	Connect  time.Duration // the upstream handshake (0: pooled or not finished)
}

// Handover is a flow the loop gives up, with what it still held.
type Handover struct {
	Down   int       // the client's socket, now the handler's
	Up     int       // the upstream socket, now the handler's (owned by UpConn if set); -1: none (ErrTaken from Dial)
	UpConn io.Closer // Upstream.Conn of the flow, if any
	ToUp   []byte    // client bytes read but not yet written upstream (a copy)
	ToDown []byte    // upstream bytes read but not yet written to the client (a copy)
	Stats  Stats
}

// ErrTaken, returned by Handler.Open, means the handler took the accepted
// socket for itself (it serves the connection some other way); the loop
// forgets it. Returned by Handler.Dial, it has the loop give the flow up
// with Handler.Handover: Up is -1 (no upstream yet) and ToUp holds every
// client byte the loop read (the head included: Consume does not apply).
var ErrTaken = errors.New("evloop: connection taken by the handler")

// ErrMore, returned by Handler.Dial for a Head, asks the loop to read more
// of the client's bytes and call Dial again when they arrive.
var ErrMore = errors.New("evloop: need more bytes")

// ErrHeadTooLarge ends a flow as Incomplete whose head filled a whole
// buffer while Dial still asked for more.
var ErrHeadTooLarge = errors.New("evloop: head larger than a buffer")

// Handler decides what each accepted connection is for. Its methods run on
// a loop's thread and must not block.
type Handler interface {
	// Open is called for each accepted connection (fd, nonblocking, from
	// client to local) on the listener registered with tag. It returns the
	// upstream and a state value handed back in the other calls. With an
	// error the loop closes fd with a reset; Open has already counted it
	// and released anything it took.
	Open(tag any, fd int, client netip.AddrPort) (Upstream, any, error)
	// Retry is called when an Upstream with Retry set failed before any
	// byte was written to it (for a FastOpen one: before its handshake
	// was confirmed). It returns a new upstream, or an error that
	// ends the flow with ConnectFailed.
	Retry(state any, failed error) (Upstream, error)
	// Dial is called for a flow whose Upstream asked to Wait, once the
	// client's first bytes (first holds them, possibly none if the wait
	// ran out or the client half-closed) are in. first is the loop's
	// buffer: valid only during the call. ErrMore (for a Head) reads on,
	// ErrTaken gives the flow up (Handover), another error ends the flow
	// with ConnectFailed.
	Dial(state any, first []byte) (Upstream, error)
	// Done is called once for every opened flow that ends in a loop, after
	// both sockets are closed.
	Done(state any, o Outcome, st Stats, err error)
	// Handover is called instead of Done for a flow that turned bulk, or
	// one Dial gave up (ErrTaken, with Up -1); the handler owns the
	// sockets from now on. It must not block: start a goroutine.
	Handover(state any, h Handover)
}
