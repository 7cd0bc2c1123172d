package cli

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/mosto-net/mosto/internal/router"
	"github.com/mosto-net/mosto/internal/xlate"
	"golang.org/x/sys/unix"
)

// newJoiner opens the kernel translation (internal/xlate) on every device
// of this network namespace, pinned in pinDir ("" for none), and returns
// the handoff's joiner and its closer (a clean stop removes the pins).
func newJoiner(ctx context.Context, env *Env, pinDir string) (*router.XlateJoiner, func(), error) {
	sp, err := xlate.Open(ctx, xlate.Config{Log: env.Log, PinDir: pinDir})
	if err != nil {
		return nil, nil, err
	}
	if st := sp.Stats(); st.Adopted > 0 {
		env.Log.Info("router: adopted handed-off sessions of an earlier process", "sessions", st.Adopted, "held", st.Held, "pin_dir", pinDir)
	}
	j := &router.XlateJoiner{Splicer: sp}
	return j, func() {
		j.Wait()
		if t := j.Times(); t.Joins > 0 {
			n := time.Duration(t.Joins)
			env.Log.Info("router: join phases, mean per handoff", "joins", t.Joins, "prepared", t.Prepared, "read", t.Read/n, "install", t.Install/n,
				"verify", t.Verify/n, "send", t.Send/n)
		}
		sp.Close()
	}, nil
}

// routerPinDir resolves --pin-dir: "off" for none, "" for the default
// /sys/fs/bpf/mosto/net<netns inode>/router-<port> (one per router of a
// network namespace).
func routerPinDir(flag, listen string) (string, error) {
	switch flag {
	case "off":
		return "", nil
	case "":
	default:
		if !filepath.IsAbs(flag) {
			return "", fmt.Errorf("--pin-dir %q: want an absolute path or off", flag)
		}
		return flag, nil
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %v", listen, err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("router: network namespace: %w", err)
	}
	return filepath.Join(xlate.DefaultBPFFS, "mosto", "net"+strconv.FormatUint(st.Ino, 10), "router-"+port), nil
}
