package scenario

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU is the processor time used during one fetch: by this process (the
// emulator, which also runs the receive path of every packet it delivers,
// the measuring client and the origin), by the proxies together, and the
// machine's busy share (every process, other users' too) over the fetch.
// Resolution: the kernel's clock tick (10 ms).
type CPU struct {
	Emu, Proxies time.Duration
	Busy         float64 // 0..1 of all CPUs
}

// cpuSnap is a reading of the counters CPU is computed from.
type cpuSnap struct {
	self, proxies time.Duration
	busy, total   uint64 // /proc/stat jiffies of all CPUs
	ok            bool
}

// clockTick is USER_HZ, the unit of /proc times (100 on Linux).
const clockTick = 10 * time.Millisecond

func (s *Scenario) cpuSnap() cpuSnap {
	var c cpuSnap
	var err error
	if c.self, err = procCPU(os.Getpid()); err != nil {
		return c
	}
	for _, p := range s.proxies {
		if p.cmd.Process == nil {
			continue
		}
		if d, err := procCPU(p.cmd.Process.Pid); err == nil {
			c.proxies += d
		}
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return c
	}
	if c.busy, c.total, err = parseProcStat(b); err != nil {
		return c
	}
	c.ok = true
	return c
}

// since returns the CPU used from a to b.
func (b cpuSnap) since(a cpuSnap) CPU {
	if !a.ok || !b.ok {
		return CPU{}
	}
	c := CPU{Emu: b.self - a.self, Proxies: b.proxies - a.proxies}
	if dt := b.total - a.total; dt > 0 {
		c.Busy = float64(b.busy-a.busy) / float64(dt)
	}
	return c
}

// procCPU returns the user + system time of process pid (all threads).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parsePidStat(b)
}

// parsePidStat reads utime + stime (fields 14 and 15) of /proc/PID/stat.
func parsePidStat(b []byte) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields", len(f)+2)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proc stat: bad utime/stime %q %q", f[11], f[12])
	}
	return time.Duration(u+s) * clockTick, nil
}

// parseProcStat returns the busy and total jiffies of the "cpu" line of
// /proc/stat (idle and iowait are not busy).
func parseProcStat(b []byte) (busy, total uint64, err error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("proc stat: no cpu line")
	}
	for k, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("proc stat: bad field %q", v)
		}
		if k >= 8 { // guest times are already in user
			break
		}
		total += n
		if k != 3 && k != 4 {
			busy += n
		}
	}
	return busy, total, nil
}
