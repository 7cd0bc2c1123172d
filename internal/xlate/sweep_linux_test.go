//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"testing"
	"time"
)

// A join that has not seen its first packet yet is not idle: a sweep right
// after the install keeps it (the request router installs before the
// surrogate's first answer; with a zero last-packet time a sweep removed
// about 1% of its sessions).
func TestSweepKeepsNewJoin(t *testing.T) {
	s := loadTest(t, 4)
	s.cfg.IdleTimeout, s.cfg.CloseLinger = time.Minute, time.Minute
	a, b := testPair(false)
	ab, ba, _ := Pair(a, b)
	ab.Ifindex, ba.Ifindex = 1, 1
	if err := s.Install(ab, ba); err != nil {
		t.Fatal(err)
	}
	if n := s.sweep(monoNow()); n != 0 || !s.Joined(ab.In) || !s.Joined(ba.In) {
		t.Fatalf("sweep right after the install removed %d joins; want 0", n)
	}
	if n := s.sweep(monoNow() + s.cfg.IdleTimeout + 1); n != 1 || s.Joined(ab.In) {
		t.Fatalf("sweep after the idle timeout removed %d joins; want 1", n)
	}
}
