package cli

import (
	"errors"
	"fmt"

	"github.com/mosto-net/mosto/internal/activation"
	"github.com/mosto-net/mosto/internal/agent"
	"github.com/mosto-net/mosto/internal/relay"
)

// takeActivated takes the sockets systemd passed to `mosto proxy` (socket
// activation, deploy/systemd/mosto-proxy@.socket): stream sockets become
// the daemon's listeners (cfg.Activated, matched by name or address), a
// datagram socket the agent's measurement endpoint. Without passed
// sockets it does nothing: the daemon binds its listeners itself.
func takeActivated(env *Env, cfg *relay.Config, acfg *agent.Config) error {
	socks, err := activation.Take()
	if err != nil {
		return err
	}
	if len(socks) == 0 {
		return nil
	}
	closeAll := func() {
		for _, s := range socks {
			s.Close()
		}
	}
	if cfg.Workers > 1 {
		closeAll()
		return errors.New("socket activation: workers > 1 is not supported (the workers bind with SO_REUSEPORT); set workers: 1")
	}
	for _, s := range socks {
		switch {
		case s.Listener != nil:
			cfg.Activated = append(cfg.Activated, s)
		case acfg != nil && acfg.ProbeConn == nil && acfg.ProbeListen != "off":
			acfg.ProbeConn = s.Packet
		default:
			closeAll()
			return fmt.Errorf("socket activation: datagram socket %q on %s: only the measurement endpoint of a proxy with a controller section takes one", s.Name, s.Addr())
		}
	}
	// The relay logs its passed listeners once they accept (off the path
	// of the connection that started this process); the measurement
	// socket is logged by runProxy beside the agent.
	return nil
}
