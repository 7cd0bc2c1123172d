//go:build !(linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64))

package xlate

import (
	"context"
	"log/slog"
	"net"
	"time"
)

// Supported reports whether this build carries the program.
const Supported = false

// Config configures a Splicer.
type Config struct {
	Interfaces    []string
	MaxEntries    int
	IdleTimeout   time.Duration
	CloseLinger   time.Duration
	SweepInterval time.Duration
	NoKick        bool
	PinDir        string
	Log           *slog.Logger
}

// Splicer is not supported on this OS.
type Splicer struct{}

// Splice is one installed join.
type Splice struct{ AB, BA Entry }

// Open fails: eBPF splicing is not supported on this OS.
func Open(ctx context.Context, cfg Config) (*Splicer, error) {
	return nil, refuse(ReasonUnsupported, "eBPF splicing is not supported on this OS")
}

// Join fails: not supported on this OS.
func (s *Splicer) Join(a, b *net.TCPConn) (*Splice, error) {
	return nil, refuse(ReasonUnsupported, "eBPF splicing is not supported on this OS")
}

// Install fails: not supported on this OS.
func (s *Splicer) Install(ab, ba Entry) error {
	return refuse(ReasonUnsupported, "eBPF splicing is not supported on this OS")
}

// Close does nothing.
func (s *Splicer) Close() error { return nil }

// DefaultBPFFS is where bpffs is mounted by convention.
const DefaultBPFFS = "/sys/fs/bpf"

// PinnedEntry is one entry found in a pin directory.
type PinnedEntry struct{ In, Out Tuple }

// ReadPinned fails: not supported on this OS.
func ReadPinned(dir string) ([]PinnedEntry, error) {
	return nil, refuse(ReasonUnsupported, "eBPF splicing is not supported on this OS")
}
