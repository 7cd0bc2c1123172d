package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/probe"
)

// Section is the `controller:` section of a proxy configuration file
// (YAML), and its only definition: `mosto proxy` decodes the file into
// relay.Config beside a *Section (internal/cli) and checks what spans both
// there. The FEP id and hop address come from the rest of the proxy
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
//	  probe_unreachable_after: 3        # failed rounds before a peer is reported unreachable
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
	// ProbeUnreachableAfter is how many failed probe rounds in a row make a
	// peer reported unreachable (it then leaves the chains); 0: 3.
	ProbeUnreachableAfter int `yaml:"probe_unreachable_after"`
}

// MaxUnreachableAfter bounds probe_unreachable_after.
const MaxUnreachableAfter = 100

// Validate checks the section on its own (what needs the rest of the proxy
// configuration is checked by Config and by its reader).
func (s Section) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.URL == "" {
		bad("controller.url: required")
	}
	if s.DataDir == "" {
		bad("controller.data_dir: required")
	}
	if s.Token != "" && s.TokenFile != "" {
		bad("controller: token and token_file are exclusive")
	}
	if s.ProbeListen == "off" && s.ProbeAddr == "" {
		bad("controller.probe_addr: required when probe_listen is off (peers must reach some endpoint)")
	}
	switch s.ProbeMethod {
	case "", "udp", "tcp":
	default:
		bad("controller.probe_method %q: want udp or tcp", s.ProbeMethod)
	}
	if s.ProbeInterval < 0 {
		bad("controller.probe_interval %v: must be positive", s.ProbeInterval)
	}
	if s.ProbeUnreachableAfter < 0 || s.ProbeUnreachableAfter > MaxUnreachableAfter {
		bad("controller.probe_unreachable_after: %d is not 0-%d (0: the default, 3)", s.ProbeUnreachableAfter, MaxUnreachableAfter)
	}
	return errors.Join(errs...)
}

// Config turns the section into an agent Config for FEP id whose hop
// listener is hopListen (used as the advertised hop address unless
// hop_addr is set). dir resolves relative data_dir and token_file names
// (the proxy configuration file's directory).
func (s Section) Config(id, hopListen, dir string) (Config, error) {
	if err := s.Validate(); err != nil {
		return Config{}, err
	}
	tok := s.Token
	if s.TokenFile != "" {
		b, err := os.ReadFile(inDir(dir, s.TokenFile))
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
	var m probe.Measurer
	if s.ProbeMethod == "tcp" {
		m = probe.TCPHandshake{}
	}
	cfg := Config{
		Controller:  s.URL,
		Token:       tok,
		DataDir:     inDir(dir, s.DataDir),
		LoP:         s.LoP,
		ProbeListen: listen,
		FEP:         api.FEP{ID: id, HopAddr: hop, ProbeAddr: adv, Location: s.Location, Lat: s.Lat, Lon: s.Lon},
		Probe:       probe.Config{Measurer: m, Interval: s.ProbeInterval, UnreachableAfter: s.ProbeUnreachableAfter},
	}
	if err := cfg.FEP.Validate(); err != nil {
		return Config{}, fmt.Errorf("controller: %w", err)
	}
	return cfg, nil
}

// inDir resolves a relative file name p against dir.
func inDir(dir, p string) string {
	if p == "" || dir == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}
