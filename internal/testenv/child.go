package testenv

import (
	"bufio"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Child is a helper process a test starts, kills with SIGKILL and starts
// again (usually this test binary re-run for one test in another network
// namespace, acting as a relay or a router). The test writes requests to
// its Stdin and reads the lines it prints behind a tag; the child serves
// until its stdin closes.
type Child struct {
	Cmd   *exec.Cmd
	Stdin io.WriteCloser
	Lines chan string   // the lines printed behind the tag, tag cut
	Done  chan struct{} // closed when the child's output ended

	name string        // "relay child": what messages call it
	wait time.Duration // how long WaitLine waits
	mu   sync.Mutex
	out  strings.Builder // stdout and stderr
}

// StartChild starts cmd (its Env already set) and collects its output;
// the lines it prints behind tag+" " go to Lines. WaitLine waits wait for
// a line. At cleanup the child is killed and, when t failed, its output
// logged.
func StartChild(t testing.TB, cmd *exec.Cmd, name, tag string, wait time.Duration) *Child {
	t.Helper()
	c := &Child{Cmd: cmd, Lines: make(chan string, 16), Done: make(chan struct{}), name: name, wait: wait}
	var err error
	if c.Stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.Done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.out.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			if rest, ok := strings.CutPrefix(sc.Text(), tag+" "); ok {
				c.Lines <- rest
			}
		}
	}()
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", c.name, c.Output())
		}
	})
	return c
}

// Output is what the child printed so far.
func (c *Child) Output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// WaitLine returns the child's next tagged line and fails t unless it
// starts with prefix, or when none comes in time.
func (c *Child) WaitLine(t testing.TB, prefix string) string {
	t.Helper()
	select {
	case l := <-c.Lines:
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("%s said %q, want %q...", c.name, l, prefix)
		}
		return l
	case <-c.Done:
		t.Fatalf("%s ended before %q:\n%s", c.name, prefix, c.Output())
	case <-time.After(c.wait):
		t.Fatalf("%s did not say %q in %v", c.name, prefix, c.wait)
	}
	return ""
}

// Kill kills the child with SIGKILL (no clean stop) and reaps it.
func (c *Child) Kill() {
	c.Cmd.Process.Kill()
	c.Cmd.Wait()
}

// Stop closes the child's stdin (a clean stop), waits for it and fails t
// unless it exited well and its test passed.
func (c *Child) Stop(t testing.TB, test string) {
	t.Helper()
	c.Stdin.Close()
	<-c.Done // every line read before Wait closes the pipe
	if err := c.Cmd.Wait(); err != nil {
		t.Fatalf("%s: %v\n%s", c.name, err, c.Output())
	}
	if !strings.Contains(c.Output(), "--- PASS: "+test) {
		t.Fatalf("%s did not pass:\n%s", c.name, c.Output())
	}
}
