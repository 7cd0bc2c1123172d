package routerbench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a process started in the world.
type proc struct {
	name string
	cmd  *exec.Cmd
}

func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// cpu is the CPU time of the process and its children (nginx workers),
// nanosecond resolution (taskRuntime).
func (p *proc) cpu() time.Duration {
	if p == nil || p.cmd.Process == nil {
		return 0
	}
	root := p.cmd.Process.Pid
	pids := []int{root}
	ents, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, e := range ents {
		b, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		f := statFields(b)
		if len(f) > 2 && f[1] == strconv.Itoa(root) {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(e))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	var total time.Duration
	for _, pid := range pids {
		total += taskRuntime(pid)
	}
	return total
}

// taskRuntime is the time on CPU of every thread of pid, in nanoseconds
// (/proc/PID/task/TID/schedstat, first field: the scheduler's
// sum_exec_runtime), not the 10 ms ticks of utime and stime, so the few
// milliseconds a handoff router spends per GB are resolved. Threads that
// exited are not counted (Go and nginx keep theirs).
func taskRuntime(pid int) time.Duration {
	ents, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/[0-9]*/schedstat")
	var ns int64
	for _, e := range ents {
		b, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		v, _ := strconv.ParseInt(f[0], 10, 64)
		ns += v
	}
	return time.Duration(ns)
}

// statFields returns the fields of /proc/PID/stat after the command name:
// [0] state, [1] ppid, ... [11] utime, [12] stime.
func statFields(b []byte) []string {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// progStats sums run_time_ns and run_cnt over the eBPF programs whose
// descriptors the process holds (/proc/PID/fdinfo: the handoff router's
// xlate programs), each program once. The kernel counts them only while
// kernel.bpf_stats_enabled is 1.
func (p *proc) progStats() (run time.Duration, cnt int64) {
	if p == nil || p.cmd.Process == nil {
		return 0, 0
	}
	ents, _ := filepath.Glob("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/fdinfo/[0-9]*")
	seen := map[string]bool{}
	for _, e := range ents {
		b, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		var id string
		var ns, n int64
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch k {
			case "prog_id":
				id = v
			case "run_time_ns":
				ns, _ = strconv.ParseInt(v, 10, 64)
			case "run_cnt":
				n, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		run += time.Duration(ns)
		cnt += n
	}
	return run, cnt
}
