package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/mosto-net/mosto/internal/agent"
	"github.com/mosto-net/mosto/internal/relay"
)

// ProxyFile is a `mosto proxy` configuration file: the daemon's settings,
// which internal/relay defines and checks, and the optional `controller:`
// section, which internal/agent defines and checks (agent.Section). This
// file only composes them and checks what spans both (Validate).
type ProxyFile struct {
	relay.Config `yaml:",inline"`
	Controller   *agent.Section `yaml:"controller"`
}

// LoadProxyFile reads and validates a proxy configuration file. Relative
// file names in it are resolved against the file's directory.
func LoadProxyFile(path string) (*ProxyFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	pf, err := ParseProxyFile(f, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return pf, nil
}

// ParseProxyFile decodes a proxy configuration strictly (an unknown key in
// any section is an error with its line) and validates it.
func ParseProxyFile(r io.Reader, dir string) (*ProxyFile, error) {
	pf := &ProxyFile{Config: relay.FileDefaults()}
	if err := relay.DecodeYAML(r, pf); err != nil {
		return nil, err
	}
	pf.Config.SetDir(dir)
	pf.Config.Managed = pf.Controller != nil
	if err := pf.Validate(); err != nil {
		return nil, err
	}
	return pf, nil
}

// Validate checks each section with its owner's Validate, then what spans
// the daemon's settings and the controller section.
func (pf *ProxyFile) Validate() error {
	errs := []error{pf.Config.Validate()}
	if cc := pf.Controller; cc != nil {
		errs = append(errs, cc.Validate())
		if cc.HopAddr == "" && pf.Hop.Listen == "" {
			errs = append(errs, errors.New("controller.hop_addr: missing (no hop.listen to default to)"))
		}
		if pf.LoP != "" && cc.LoP != "" {
			errs = append(errs, errors.New("lop: set at most one of lop (a remote LoP completes each flow's route) and controller.lop (this FEP looks chains up in that LoP's table)"))
		}
		if pf.Workers > 1 {
			errs = append(errs, fmt.Errorf("workers: %d with a controller section: each worker would run its own agent; run one process", pf.Workers))
		}
	}
	return errors.Join(errs...)
}

// agentConfig is the controller agent's configuration, or nil without a
// controller section.
func (pf *ProxyFile) agentConfig() (*agent.Config, error) {
	if pf.Controller == nil {
		return nil, nil
	}
	ac, err := pf.Controller.Config(pf.ID, pf.Hop.Listen, pf.Config.Dir())
	if err != nil {
		return nil, err
	}
	return &ac, nil
}
