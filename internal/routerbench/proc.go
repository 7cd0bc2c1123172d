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

// cpu is the CPU time (user + system) of the process and its children
// (nginx workers).
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
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		f := statFields(b)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
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
