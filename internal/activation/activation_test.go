package activation

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

const childEnv = "MOSTO_ACTIVATION_TEST_CHILD"

// TestMain: as a child, take the passed sockets, answer one connection
// on the first listener with the names and kinds of every socket, exit.
func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "echo":
		os.Exit(child())
	case "fail":
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func child() int {
	socks, err := Take()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Getenv(EnvPID) != "" || os.Getenv(EnvFDs) != "" {
		fmt.Fprintln(os.Stderr, "variables not cleared")
		return 1
	}
	var desc []string
	var ln net.Listener
	for _, s := range socks {
		kind := "packet"
		if s.Listener != nil {
			kind = "stream"
			if ln == nil {
				ln = s.Listener
			}
		}
		desc = append(desc, s.Name+"="+kind)
	}
	if ln == nil {
		return 1
	}
	c, err := ln.Accept()
	if err != nil {
		return 1
	}
	fmt.Fprintf(c, "%d %s\n", os.Getpid(), strings.Join(desc, ","))
	c.Close()
	return 0
}

func TestParse(t *testing.T) {
	open := func(fd int, name string) (Socket, error) { return Socket{Name: name, FD: fd}, nil }
	tests := []struct {
		pid, fds, names string
		want            string // names and fds, or the error's text
	}{
		{"", "", "", ""},
		{"99", "2", "", ""}, // another process's
		{"42", "2", "hop:probe", "hop@3 probe@4"},
		{"42", "2", "", "@3 @4"},
		{"42", "1", "unknown", "@3"},
		{"42", "0", "", ""},
		{"x", "1", "", "not a process id"},
		{"42", "-1", "", "want 0..1024"},
		{"42", "5000", "", "want 0..1024"},
		{"42", "2", "hop", "1 names for 2 sockets"},
		{"", "1", "", "not a process id"},
	}
	for _, tc := range tests {
		socks, err := parse(tc.pid, tc.fds, tc.names, 42, open)
		var got string
		if err != nil {
			got = err.Error()
		} else {
			var parts []string
			for _, s := range socks {
				parts = append(parts, fmt.Sprintf("%s@%d", s.Name, s.FD))
			}
			got = strings.Join(parts, " ")
		}
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("parse(%q, %q, %q) = %q; want %q", tc.pid, tc.fds, tc.names, got, tc.want)
		}
	}
}

// TestTakeRefusesNonSockets: a descriptor that is not a socket, or a
// stream socket that is not listening, is an error.
func TestTakeRefusesNonSockets(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fromFD(int(f.Fd()), "file"); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("fromFD(file) = %v; want not a socket", err)
	}
}

func exe(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestActivator: nothing runs until the first connection; then the child
// gets both sockets with their names and answers that connection; a
// second connection after it exited starts a new process.
func TestActivator(t *testing.T) {
	testenv.CheckLeaks(t)
	hop, addr, err := ListenTCP("hop", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hop.File.Close()
	probe, _, err := ListenUDP("probe", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer probe.File.Close()
	var mu sync.Mutex
	var starts []int
	a := &Activator{
		Sockets: []Passed{hop, probe},
		Command: func() *exec.Cmd {
			c := exec.Command(exe(t), "-test.run=^$")
			c.Env = append(os.Environ(), childEnv+"=echo")
			c.Stderr = os.Stderr
			return c
		},
		OnStart: func(_ time.Time, p *os.Process) { mu.Lock(); starts = append(starts, p.Pid); mu.Unlock() },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(100 * time.Millisecond) // nothing may start without a connection
	mu.Lock()
	if len(starts) != 0 {
		t.Errorf("started %d processes before any connection", len(starts))
	}
	mu.Unlock()
	for round := 1; round <= 2; round++ {
		c, err := net.DialTimeout("tcp", addr.String(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var pid int
		var desc string
		fmt.Sscanf(line, "%d %s", &pid, &desc)
		if desc != "hop=stream,probe=packet" {
			t.Errorf("round %d: child saw %q; want hop=stream,probe=packet", round, desc)
		}
		mu.Lock()
		if len(starts) != round || starts[round-1] != pid {
			t.Errorf("round %d: starts %v, child pid %d (LISTEN_PID must be the child's own pid)", round, starts, pid)
		}
		mu.Unlock()
	}
}

// TestActivatorStartLimit: a command that fails at every start (and so
// never accepts the queued connection) is started StartLimit times, then
// Run gives up with ErrStartLimit instead of restarting it for ever.
func TestActivatorStartLimit(t *testing.T) {
	hop, addr, err := ListenTCP("hop", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hop.File.Close()
	starts := 0
	a := &Activator{
		Sockets:    []Passed{hop},
		StartLimit: 3,
		Command: func() *exec.Cmd {
			c := exec.Command(exe(t), "-test.run=^$")
			c.Env = append(os.Environ(), childEnv+"=fail")
			return c
		},
		OnStart: func(time.Time, *os.Process) { starts++ },
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Run(ctx); !errors.Is(err, ErrStartLimit) {
		t.Fatalf("Run = %v; want ErrStartLimit", err)
	}
	if starts != 3 {
		t.Errorf("%d starts; want 3", starts)
	}
	if err := (&Activator{Sockets: []Passed{{Name: "a:b", File: hop.File}}, Command: a.Command}).Run(ctx); err == nil || !strings.Contains(err.Error(), "no ':'") {
		t.Errorf("a name with ':' = %v; want refused", err)
	}
}

// FuzzParse: any variables give sockets or an error, never a panic, and
// never more sockets than LISTEN_FDS says.
func FuzzParse(f *testing.F) {
	f.Add("42", "2", "hop:probe")
	f.Add("42", "1", "")
	f.Add("x", "-1", "::")
	f.Fuzz(func(t *testing.T, pid, fds, names string) {
		open := func(fd int, name string) (Socket, error) { return Socket{Name: name, FD: fd}, nil }
		socks, err := parse(pid, fds, names, 42, open)
		if err != nil {
			return
		}
		for i, s := range socks {
			if s.FD != FirstFD+i {
				t.Fatalf("socket %d at fd %d", i, s.FD)
			}
		}
		if len(socks) > maxFDs {
			t.Fatalf("%d sockets", len(socks))
		}
	})
}
