package emu

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// writeSysctl writes a sysctl of the calling thread's network namespace
// (net/... paths under /proc/sys resolve per thread).
func writeSysctl(key, value string) error {
	if err := os.WriteFile("/proc/sys/"+key, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(key, "/", "."), value, err)
	}
	return nil
}

func readSysctl(key string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + key)
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", strings.ReplaceAll(key, "/", "."), err)
	}
	return strings.TrimSpace(string(b)), nil
}

// applyTCP sets the per-namespace TCP settings; it runs inside the host's
// namespace.
func applyTCP(t TCP) error {
	rmem, wmem := t.RmemMax, t.WmemMax
	if rmem == 0 {
		rmem = DefaultBufMax
	}
	if wmem == 0 {
		wmem = DefaultBufMax
	}
	sets := [][2]string{
		{"net/ipv4/tcp_rmem", fmt.Sprintf("4096 131072 %d", rmem)},
		{"net/ipv4/tcp_wmem", fmt.Sprintf("4096 16384 %d", wmem)},
		{"net/ipv4/ping_group_range", "0 2147483647"},
		// Every connection starts from the configured slow start, not from
		// metrics cached by earlier connections to the same host.
		{"net/ipv4/tcp_no_metrics_save", "1"},
	}
	if t.Congestion != "" {
		sets = append(sets, [2]string{"net/ipv4/tcp_congestion_control", t.Congestion})
	}
	if t.SlowStartAfterIdle != nil {
		sets = append(sets, [2]string{"net/ipv4/tcp_slow_start_after_idle", fmt.Sprint(*t.SlowStartAfterIdle)})
	}
	for _, s := range sets {
		if err := writeSysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	// net.core.[rw]mem_max are per namespace on recent kernels only; they
	// cap SO_RCVBUF/SO_SNDBUF, not autotuning, so failing here is harmless.
	writeSysctl("net/core/rmem_max", fmt.Sprint(rmem))
	writeSysctl("net/core/wmem_max", fmt.Sprint(wmem))
	return nil
}

const allowedCCKey = "net/ipv4/tcp_allowed_congestion_control"

// allowCongestion makes sure the root namespace lets other namespaces choose
// cc, remembering the old value for restoreCongestion.
func (w *World) allowCongestion(cc string) error {
	if cc == "" {
		return nil
	}
	avail, err := readSysctl("net/ipv4/tcp_available_congestion_control")
	if err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	if !slices.Contains(strings.Fields(avail), cc) {
		return fmt.Errorf("emu: tcp: congestion control %q is not available (have: %s)", cc, avail)
	}
	allowed, err := readSysctl(allowedCCKey)
	if err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	if slices.Contains(strings.Fields(allowed), cc) {
		return nil
	}
	val := strings.TrimSpace(allowed + " " + cc)
	if err := writeSysctl(allowedCCKey, val); err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	w.restoreCC, w.setCC = allowed, val
	w.log.Info("allowed congestion control in the root namespace", "cc", cc)
	return nil
}

// restoreCongestion puts the root allowed list back, unless someone changed
// it since (another world may rely on it then).
func (w *World) restoreCongestion() error {
	if w.setCC == "" {
		return nil
	}
	cur, err := readSysctl(allowedCCKey)
	if err != nil {
		return err
	}
	if cur != w.setCC {
		return nil
	}
	if err := writeSysctl(allowedCCKey, w.restoreCC); err != nil {
		return errors.Join(fmt.Errorf("emu: restore root sysctl"), err)
	}
	return nil
}
