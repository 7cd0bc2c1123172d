package tcpjoin

import (
	"errors"
	"fmt"
)

// Conn is one of the router's two connections at the moment of the join,
// seen from the router ("local") and its peer ("remote").
type Conn struct {
	LocalISN, RemoteISN uint32
	// Sent is the number of data bytes the router sent on the connection
	// (its snd_nxt - LocalISN - 1, mod 2^32), Received the number it
	// received (rcv_nxt - RemoteISN - 1).
	Sent, Received uint32
	// SACK and TS report whether SACK and timestamps were negotiated.
	SACK, TS bool
	// LocalTSval is the last TSval the router sent, RemoteTSval the last one
	// it received (TS.Recent), valid when TS.
	LocalTSval, RemoteTSval uint32
	// LocalWScale is the shift the router announced in its SYN (the peer
	// scales the router's window fields by it), RemoteWScale the peer's.
	// Both are 0 without window scaling.
	LocalWScale, RemoteWScale uint8
	// RemoteMSS is the MSS the peer announced.
	RemoteMSS uint16
}

// Entry is the translation of one direction's TCP headers.
type Entry struct {
	// SeqDelta is added to the sequence number, AckDelta to the
	// acknowledgment number and to both edges of every SACK block.
	SeqDelta, AckDelta uint32
	// TS: TSvalDelta is added to TSval, TSecrDelta to TSecr.
	TS                     bool
	TSvalDelta, TSecrDelta uint32
	// The window field is read with shift WinIn and written with WinOut.
	WinIn, WinOut uint8
}

// Join is the pair of entries of a join.
type Join struct {
	// ClientToSurrogate rewrites the client's segments (seed: inc_seq(SeqCS),
	// inc_ack(AckCS)); SurrogateToClient the surrogate's (inc_seq(SeqSC),
	// inc_ack(AckSC)).
	ClientToSurrogate, SurrogateToClient Entry
}

// ErrMismatch marks a pair of connections that cannot be joined as they
// are: the router should pick another pre-established connection.
var ErrMismatch = errors.New("tcpjoin: connections do not match")

// Plan computes the join of the router's connection to the client c and its
// connection to the surrogate s. The client's later bytes follow the bytes
// it sent to the router (c.Received) in the surrogate's view of the stream
// after the bytes the router sent the surrogate (s.Sent), and the
// surrogate's later bytes follow, in the client's view, the bytes the router
// sent the client (c.Sent):
//
//	SeqCS = (LocalISN_s + 1 + Sent_s) - (RemoteISN_c + 1 + Received_c)   (formula 1 with Rrs, Rcr)
//	SeqSC = (LocalISN_c + 1 + Sent_c) - (RemoteISN_s + 1 + Received_s)   (formula 3, + data already sent)
//	AckSC = -SeqCS, AckCS = -SeqSC                                        (formulas 2 and 4)
//
// SACK blocks move with the acknowledgment number; TSval is shifted so the
// receiver's PAWS check sees the peer's clock continue from the router's last
// value, and TSecr shifted back; window fields are rescaled between the
// shifts each side negotiated. It returns ErrMismatch when timestamps were
// negotiated on one connection only (one side would then drop or misread
// them) or when the surrogate's segments would exceed the client's MSS.
func Plan(c, s Conn) (Join, error) {
	if c.TS != s.TS {
		return Join{}, fmt.Errorf("%w: timestamps on the client's connection %v, on the surrogate's %v", ErrMismatch, c.TS, s.TS)
	}
	if c.RemoteMSS != 0 && s.RemoteMSS != 0 && s.RemoteMSS > c.RemoteMSS {
		// The surrogate sends up to the MSS the router announced to it,
		// bounded by its own; refuse when the surrogate's is larger than
		// the client's (its segments might not fit the client's path).
		return Join{}, fmt.Errorf("%w: surrogate MSS %d above the client's %d", ErrMismatch, s.RemoteMSS, c.RemoteMSS)
	}
	seqCS := (s.LocalISN + 1 + s.Sent) - (c.RemoteISN + 1 + c.Received)
	seqSC := (c.LocalISN + 1 + c.Sent) - (s.RemoteISN + 1 + s.Received)
	j := Join{
		ClientToSurrogate: Entry{SeqDelta: seqCS, AckDelta: -seqSC, WinIn: c.RemoteWScale, WinOut: s.LocalWScale},
		SurrogateToClient: Entry{SeqDelta: seqSC, AckDelta: -seqCS, WinIn: s.RemoteWScale, WinOut: c.LocalWScale},
	}
	if c.TS {
		// The client's TSval continues the router's clock on s; the
		// surrogate's continues the router's clock on c. Each echo goes back
		// through the other direction's delta.
		tsCS := s.LocalTSval - c.RemoteTSval
		tsSC := c.LocalTSval - s.RemoteTSval
		j.ClientToSurrogate.TS, j.ClientToSurrogate.TSvalDelta, j.ClientToSurrogate.TSecrDelta = true, tsCS, -tsSC
		j.SurrogateToClient.TS, j.SurrogateToClient.TSvalDelta, j.SurrogateToClient.TSecrDelta = true, tsSC, -tsCS
	}
	return j, nil
}

// SeedFormulas returns the seed's increments (formulas 1-4) from its six
// inputs: Srs, Scr, Rrs, Rcr, Src, Ssr.
func SeedFormulas(srs, scr, rrs, rcr, src, ssr uint32) (sincCS, aincSC, sincSC, aincCS uint32) {
	const two32 = 1 << 32
	s1 := (two32 + (int64(srs) - int64(scr)) + (int64(rrs) - int64(rcr))) % two32
	if s1 < 0 {
		s1 += two32
	}
	s2 := (two32 - s1) % two32
	s3 := (two32 + (int64(src) - int64(ssr))) % two32
	s4 := (two32 - s3) % two32
	return uint32(s1), uint32(s2), uint32(s3), uint32(s4)
}
