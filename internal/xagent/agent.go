package xagent

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mosto-net/mosto/internal/xlate"
)

// Installer is what an Agent needs of the translation: *xlate.Splicer
// opened with Config.Egress.
type Installer interface {
	InstallEgress(e xlate.Entry) error
	RemoveEgress(in xlate.Tuple) bool
}

// handshakeTimeout bounds an agent's or a router's handshake.
const handshakeTimeout = 10 * time.Second

// installMsg is an Install frame's body.
type installMsg struct {
	ID    uint64      `json:"id"`
	Entry xlate.Entry `json:"entry"`
}

// resultMsg is a Result frame's body: Err is empty on success.
type resultMsg struct {
	ID  uint64 `json:"id"`
	Err string `json:"err,omitempty"`
}

// Agent serves routers' control connections on a surrogate's host.
type Agent struct {
	// Key is the key shared with the routers (at least 16 bytes).
	Key   []byte
	Xlate Installer
	// InNetns, when set, runs an install in the surrogate's network
	// namespace (where its route to the client is looked up); nil: the
	// calling thread's (the agent runs in it).
	InNetns func(fn func() error) error
	// Priority, when above 0, serves each control connection on a
	// SCHED_FIFO thread of that priority with blocking reads, so an
	// install is handled as soon as it arrives (it races the surrogate's
	// answer); falls back to a normal goroutine when refused.
	Priority int
	Log      *slog.Logger

	installed, refused, authFailed atomic.Int64
}

// AgentStats are an agent's counters.
type AgentStats struct {
	Installed, Refused, AuthFailed int64
}

// Stats returns the counters.
func (a *Agent) Stats() AgentStats {
	return AgentStats{Installed: a.installed.Load(), Refused: a.refused.Load(), AuthFailed: a.authFailed.Load()}
}

// Serve accepts control connections on ln until ctx ends (it closes ln)
// and waits for their goroutines.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	if len(a.Key) < 16 {
		return errors.New("xagent: key shorter than 16 bytes")
	}
	log := a.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("xagent: accept: %w", err)
		}
		wg.Go(func() {
			defer c.Close()
			cstop := context.AfterFunc(ctx, func() { c.Close() })
			defer cstop()
			if err := a.serveConn(ctx, c, log); err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
				log.Warn("xagent: control connection", "peer", c.RemoteAddr(), "err", err)
			}
		})
	}
}

func (a *Agent) serveConn(ctx context.Context, c net.Conn, log *slog.Logger) error {
	boot, err := bootID()
	if err != nil {
		return err
	}
	h := hello{BootID: boot}
	rand.Read(h.Nonce[:])
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	h.Mono = int64(monoNow())
	if _, err := c.Write(h.marshal()); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	var in [nonceLen + 32]byte
	if _, err := io.ReadFull(br, in[:]); err != nil {
		return err
	}
	nc := in[:nonceLen]
	if !hmac.Equal(in[nonceLen:], clientProof(a.Key, h.Nonce[:], nc)) {
		a.authFailed.Add(1)
		return ErrAuth
	}
	if _, err := c.Write(agentProof(a.Key, h.Nonce[:], nc)); err != nil {
		return err
	}
	c.SetDeadline(time.Time{})
	fr := newFramer(sessionKey(a.Key, h.Nonce[:], nc), dirToRouter, dirToAgent)
	var rw io.ReadWriter = c
	if a.Priority > 0 {
		if br.Buffered() > 0 {
			return errors.New("xagent: router sent frames before the handshake ended")
		}
		f, stop, err := realtimeFile(c, a.Priority)
		if err != nil {
			log.Warn("xagent: control connection on a normal thread", "err", err)
		} else {
			defer f.Close()
			done := context.AfterFunc(ctx, stop)
			defer done()
			rw = f
			br = bufio.NewReader(f)
		}
	}
	var out []byte
	for {
		typ, body, err := fr.read(br)
		if err != nil {
			if errors.Is(err, ErrAuth) {
				a.authFailed.Add(1)
			}
			return err
		}
		switch typ {
		case msgInstall:
			var m installMsg
			res := resultMsg{}
			if err := json.Unmarshal(body, &m); err != nil {
				return fmt.Errorf("xagent: install frame: %w", err)
			}
			res.ID = m.ID
			e := m.Entry
			e.Ifindex, e.Remote = 0, false // this host's routes decide
			install := func() error { return a.Xlate.InstallEgress(e) }
			var err error
			if a.InNetns != nil {
				err = a.InNetns(install)
			} else {
				err = install()
			}
			if err != nil {
				a.refused.Add(1)
				res.Err = err.Error()
			} else {
				a.installed.Add(1)
			}
			rb, _ := json.Marshal(res)
			out = fr.appendFrame(out[:0], msgResult, rb)
			if _, err := rw.Write(out); err != nil {
				return err
			}
		case msgRemove:
			var t xlate.Tuple
			if err := json.Unmarshal(body, &t); err != nil {
				return fmt.Errorf("xagent: remove frame: %w", err)
			}
			a.Xlate.RemoveEgress(t)
		default:
			return fmt.Errorf("xagent: unknown frame type %d", typ)
		}
	}
}
