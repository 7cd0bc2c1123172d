package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/probe"
)

// Section is the `controller:` section of a proxy configuration file
// (YAML). The FEP id and hop address come from the rest of the proxy
// configuration; Config combines them.
//
//	controller:
//	  url: https://controller.example:7443
//	  token_file: /etc/mosto/token     # or token: mosto1....; needed only until joined
//	  data_dir: /var/lib/mosto
//	  lop: fra                          # default: this FEP
//	  hop_addr: 203.0.113.7:7000        # advertised hop address; default: the hop listen address
//	  probe_listen: ":7001"             # UDP measurement endpoint; "off" = none
//	  probe_addr: 203.0.113.7:7001      # advertised; default: probe_listen
//	  location: Frankfurt, DE
//	  lat: 50.11
//	  lon: 8.68
//	  probe_interval: 10s
//	  probe_method: udp                 # udp (echo endpoint) or tcp (handshake to probe_addr)
type Section struct {
	URL           string        `yaml:"url"`
	Token         string        `yaml:"token"`
	TokenFile     string        `yaml:"token_file"`
	DataDir       string        `yaml:"data_dir"`
	LoP           string        `yaml:"lop"`
	HopAddr       string        `yaml:"hop_addr"`
	ProbeListen   string        `yaml:"probe_listen"`
	ProbeAddr     string        `yaml:"probe_addr"`
	Location      string        `yaml:"location"`
	Lat           float64       `yaml:"lat"`
	Lon           float64       `yaml:"lon"`
	ProbeInterval time.Duration `yaml:"probe_interval"`
	ProbeMethod   string        `yaml:"probe_method"`
}

// Config turns the section into an agent Config for FEP id whose hop
// listener is hopListen (used as the advertised hop address unless
// hop_addr is set).
func (s Section) Config(id, hopListen string) (Config, error) {
	if s.URL == "" {
		return Config{}, errors.New("controller.url: required")
	}
	if s.DataDir == "" {
		return Config{}, errors.New("controller.data_dir: required")
	}
	if s.Token != "" && s.TokenFile != "" {
		return Config{}, errors.New("controller: token and token_file are exclusive")
	}
	tok := s.Token
	if s.TokenFile != "" {
		b, err := os.ReadFile(s.TokenFile)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// Fine once joined: the token file may be deleted after the join.
		case err != nil:
			return Config{}, fmt.Errorf("controller.token_file: %w", err)
		default:
			tok = strings.TrimSpace(string(b))
		}
	}
	hop := s.HopAddr
	if hop == "" {
		hop = hopListen
	}
	if h, _, err := net.SplitHostPort(hop); err == nil && (h == "" || h == "0.0.0.0" || h == "::") {
		return Config{}, fmt.Errorf("controller.hop_addr: the hop listener %q has no routable host; set the advertised address", hop)
	}
	listen := s.ProbeListen
	if listen == "" {
		listen = s.ProbeAddr
	}
	adv := s.ProbeAddr
	if adv == "" {
		adv = listen
	}
	if listen == "off" && s.ProbeAddr == "" {
		return Config{}, errors.New("controller.probe_addr: required when probe_listen is off (peers must reach some endpoint)")
	}
	var m probe.Measurer
	switch s.ProbeMethod {
	case "", "udp":
	case "tcp":
		m = probe.TCPHandshake{}
	default:
		return Config{}, fmt.Errorf("controller.probe_method %q: want udp or tcp", s.ProbeMethod)
	}
	if s.ProbeInterval < 0 {
		return Config{}, fmt.Errorf("controller.probe_interval %v: must be positive", s.ProbeInterval)
	}
	cfg := Config{
		Controller:  s.URL,
		Token:       tok,
		DataDir:     s.DataDir,
		LoP:         s.LoP,
		ProbeListen: listen,
		FEP:         api.FEP{ID: id, HopAddr: hop, ProbeAddr: adv, Location: s.Location, Lat: s.Lat, Lon: s.Lon},
		Probe:       probe.Config{Measurer: m, Interval: s.ProbeInterval},
	}
	if err := cfg.FEP.Validate(); err != nil {
		return Config{}, fmt.Errorf("controller: %w", err)
	}
	return cfg, nil
}
