//go:build !(linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64))

package router

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/xlate"
)

// XlateJoiner needs Linux.
type XlateJoiner struct {
	Splicer                    *xlate.Splicer
	Linger                     time.Duration
	Ifindex                    int
	Placer                     Placer
	Triangle                   func(client, surrogate netip.Addr) bool
	PlaceTimeout, PlaceBackoff time.Duration
}

// Placement counts nothing: no kernel translation on this OS.
func (j *XlateJoiner) Placement() (placed, released int64) { return 0, 0 }

// ErrJoinRefused marks a join that did not happen; both connections work.
var ErrJoinRefused = errors.New("router: join refused")

// Join refuses: no kernel translation on this OS.
func (j *XlateJoiner) Join(ctx context.Context, client, surrogate *net.TCPConn, prepared any, pending []byte, headLen int) (int, error) {
	return 0, ErrJoinRefused
}

// Wait returns at once.
func (j *XlateJoiner) Wait() {}

// DelayHandshakeAck does nothing on this OS.
func DelayHandshakeAck(network, address string, c syscall.RawConn) error { return nil }
