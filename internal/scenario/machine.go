package scenario

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/mosto-net/mosto/internal/stats"
	"github.com/mosto-net/mosto/internal/transfer"
)

// MachineRateSize is the size of MeasureMachineRate's fetches: inside one
// round of the chain's pooled hops with 10000-segment windows (14.6 MB),
// so its second half is bound by the machine, not by a round.
const MachineRateSize = 12_000_000

// MachineRates are rates in bytes per second at which this machine moves a
// response through the emulator (0: not measured). The emulated worlds
// state no rate, but every byte crosses the emulator once per emulated
// link, and the relays and both ends' TCP stacks share the machine's cores.
type MachineRates struct {
	// Chain is the rate along the chain's data path from the InP on: the
	// hops, the EgP's origin connection, the relays (the client's access
	// segment is left out: a lossy or rate-limited access would be
	// counted twice, in the rate and in the model's loss and rate terms).
	Chain float64
	// Link is the rate over one emulated link (the origin to the EgP, when
	// they are less than 2 ms apart), with the origin and the measuring
	// client: the fastest any mode's bytes can cross the machine, so
	// client-origin RTT + size / Link bounds every mode.
	Link float64
}

// MeasureMachineRate measures MachineRates: for each, the median over n
// fetches of MachineRateSize bytes of the second half of the body over the
// time it took (Chain through the InP's service of the largest size class,
// from the InP's namespace; Link from the EgP's namespace to the origin
// directly). The fetches are not samples of any mode. Chain needs windows
// that hold the fetch in one round (route initcwnd/initrwnd levers of
// about 10000 segments), else its second half is also bound by rounds and
// the rate is too low.
func (s *Scenario) MeasureMachineRate(ctx context.Context, n int) (MachineRates, error) {
	var mr MachineRates
	if n < 1 {
		return mr, errors.New("scenario: machine rate needs at least one fetch")
	}
	c, err := s.client(Chain, slices.Max(s.cfg.Sizes))
	if err != nil {
		return mr, err
	}
	inp := s.roles.InP
	fromInP := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return s.w.Dial(ctx, inp, network, addr)
	}
	if mr.Chain, err = s.secondHalfRate(ctx, &transfer.Client{Addr: c.Addr, Dial: fromInP}, n, true); err != nil {
		return mr, fmt.Errorf("scenario: machine rate along the chain: %w", err)
	}
	egp, o := s.roles.EgP, s.roles.Origin
	if s.w.RTT(egp, o) < 2*time.Millisecond {
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			return s.w.Dial(ctx, egp, network, addr)
		}
		if mr.Link, err = s.secondHalfRate(ctx, &transfer.Client{Addr: s.addr(o, originPort), Dial: dial}, n, false); err != nil {
			return mr, fmt.Errorf("scenario: machine rate over one link: %w", err)
		}
	}
	return mr, nil
}

// secondHalfRate fetches MachineRateSize bytes n times with c and returns
// the median rate of the second half of the body; chain: the proxies are
// brought into the chain's state first.
func (s *Scenario) secondHalfRate(ctx context.Context, c *transfer.Client, n int, chain bool) (float64, error) {
	c.MarkAt = MachineRateSize / 2
	var rates []float64
	for i := range n {
		if chain {
			if err := s.prepare(ctx, Chain); err != nil {
				return 0, err
			}
		}
		res, err := c.Object(ctx, MachineRateSize, uint64(900_000+i))
		if err != nil {
			return 0, err
		}
		if d := res.Total - res.Mark; res.Mark > 0 && d > 0 {
			rates = append(rates, float64(MachineRateSize-c.MarkAt)/d.Seconds())
		}
	}
	if len(rates) == 0 {
		return 0, errors.New("no fetch timed its second half")
	}
	return stats.Median(rates), nil
}

// SetMachineRate gives the fetch model and the report the machine's rates
// (from MeasureMachineRate; zero values: none): the chain's client segment
// then has rate Chain unless the world states a smaller one, and the
// report adds the limit with Link.
func (s *Scenario) SetMachineRate(mr MachineRates) {
	s.machine = MachineRates{Chain: max(mr.Chain, 0), Link: max(mr.Link, 0)}
}
