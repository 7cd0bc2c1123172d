package proxybench

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of utime/stime in /proc/PID/stat (100 on
// every Linux architecture Go supports).
const clockTick = 100

// procStat is what we read of one /proc/PID/stat.
type procStat struct {
	ppid     int
	cpu      time.Duration // utime + stime, all threads
	rssPages int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// parseStat parses /proc/PID/stat; the command name may hold spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("proc stat: no ')' in %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15, rss 24.
	if len(f) < 22 {
		return procStat{}, fmt.Errorf("proc stat: %d fields", len(f)+2)
	}
	num := func(k int) int64 {
		v, _ := strconv.ParseInt(f[k-3], 10, 64)
		return v
	}
	ticks := num(14) + num(15)
	return procStat{
		ppid:     int(num(4)),
		cpu:      time.Duration(ticks) * time.Second / clockTick,
		rssPages: num(24),
	}, nil
}

// tree returns pid and all its descendants that are alive.
func tree(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []int{pid}
	}
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(p); err == nil {
			children[st.ppid] = append(children[st.ppid], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// rssAnon returns the anonymous (private, not file-backed) resident memory
// of pid from /proc/PID/status, in bytes.
func rssAnon(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	return parseRssAnon(b)
}

func parseRssAnon(b []byte) int64 {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 && f[1] == "kB" {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}

// anonUsage sums anonymous RSS over the process trees of pids.
func anonUsage(pids []int) int64 {
	var n int64
	for _, root := range pids {
		for _, p := range tree(root) {
			n += rssAnon(p)
		}
	}
	return n
}

// usage sums CPU time and RSS over the process trees of pids.
func usage(pids []int) (cpu time.Duration, rss int64) {
	page := int64(os.Getpagesize())
	for _, root := range pids {
		for _, p := range tree(root) {
			st, err := readStat(p)
			if err != nil {
				continue
			}
			cpu += st.cpu
			rss += st.rssPages * page
		}
	}
	return cpu, rss
}

// switches sums the context switches (voluntary and not) of every thread
// of the process trees of pids.
func switches(pids []int) int64 {
	var n int64
	for _, root := range pids {
		for _, p := range tree(root) {
			tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(p), "task"))
			if err != nil {
				continue
			}
			for _, t := range tasks {
				b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "task", t.Name(), "status"))
				if err == nil {
					n += parseSwitches(b)
				}
			}
		}
	}
	return n
}

// parseSwitches returns voluntary_ctxt_switches + nonvoluntary_ctxt_switches
// of a /proc/PID/status text (0 for what is missing or malformed).
func parseSwitches(b []byte) int64 {
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
			continue
		}
		if x, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && x > 0 {
			n = min(n, math.MaxInt64-x) + x // saturates
		}
	}
	return n
}

// machineCPU returns the busy and the total CPU time of the machine, all
// CPUs summed, from the first line of /proc/stat (busy: user, nice,
// system, irq, softirq, steal; total adds idle and iowait).
func machineCPU() (busy, total time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	return parseMachineCPU(b)
}

func parseMachineCPU(b []byte) (busy, total time.Duration) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	var v [8]int64
	for i := range v {
		v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	// user nice system idle iowait irq softirq steal
	b0 := v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
	t0 := b0 + v[3] + v[4]
	return time.Duration(b0) * time.Second / clockTick, time.Duration(t0) * time.Second / clockTick
}

// selfCPU returns the CPU time of this process (the load generators and
// the sink), without its children (the relays).
func selfCPU() time.Duration {
	st, err := readStat(os.Getpid())
	if err != nil {
		return 0
	}
	return st.cpu
}
