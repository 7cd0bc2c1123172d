package ttsbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/intercept"
)

// pepsal starts the PEPsal peer on host: its own TPROXY rules (intercept,
// scope: server port portPEPsal; a mark and route table of its own beside
// the proxy's) steering to its listener, then the binary with its
// defaults (transparent both ways: its upstream socket binds the client's
// address, as mosto's tproxy entry does).
func (l *lab) pepsal(ctx context.Context, host string) error {
	ic, err := intercept.Install(ctx, intercept.Config{
		Name: "pepsal", Port: pepsalPort, Ports: []intercept.PortRange{{Lo: portPEPsal, Hi: portPEPsal}},
		Mark: 0x5045, RouteTable: 20549, NetNS: l.w.NetNS(host),
	}, l.cfg.Log)
	if err != nil {
		return fmt.Errorf("ttsbench: pepsal rules: %w", err)
	}
	l.ics = append(l.ics, ic)
	logf, err := os.Create(filepath.Join(l.cfg.Dir, fmt.Sprintf("pepsal-%s-%s.log", l.w.RunID(), host)))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := l.w.Command(context.Background(), host, l.cfg.PEPsal, "-p", fmt.Sprint(pepsalPort), "-c", "1000")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("ttsbench: start pepsal in %s: %w", host, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	l.procs = append(l.procs, p)
	// Ready when its port listens (a connection to it would loop back to
	// itself as the original destination).
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := l.w.Command(ctx, host, "ss", "-Hltn", fmt.Sprintf("sport = :%d", pepsalPort)).Output()
		if strings.TrimSpace(string(out)) != "" {
			return nil
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("ttsbench: pepsal in %s exited: %s", host, b)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ttsbench: pepsal in %s not listening after 30 s", host)
		}
	}
}
