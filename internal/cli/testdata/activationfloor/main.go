// Command activationfloor is the least a socket-activated Go proxy does,
// to measure what any Go process costs the activation figures on a
// machine (docs/ops.md, "Socket activation"): it takes the passed socket
// (fd 3), accepts one connection, waits 20 ms for client data as mosto's
// service entry does, dials the origin of the configuration's first
// service and copies the origin's bytes to the client, then waits for
// SIGTERM. It is not mosto: it reads `origin: '...'` from the file given
// as its third argument (`proxy --config FILE`, the activation tests'
// command line). Build it static and pass it as MOSTO_ACTIVATION_BIN_B (it
// serves one connection, so it cannot be the always-running proxy):
//
//	CGO_ENABLED=0 go build -o /tmp/floor ./internal/cli/testdata/activationfloor
package main

import (
	"errors"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(); err != nil {
		os.Stderr.WriteString("activationfloor: " + err.Error() + "\n")
		os.Exit(1)
	}
}

func run() error {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	if len(os.Args) != 4 {
		return errors.New("usage: activationfloor proxy --config FILE")
	}
	cfg, err := os.ReadFile(os.Args[3])
	if err != nil {
		return err
	}
	_, origin, _ := strings.Cut(string(cfg), "origin: '")
	origin, _, ok := strings.Cut(origin, "'")
	if !ok {
		return errors.New(os.Args[3] + ": no origin: '...'")
	}
	ln, err := net.FileListener(os.NewFile(3, "passed"))
	if err != nil {
		return err
	}
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	c.Read(make([]byte, 1)) // the origin speaks first in the tests
	c.SetReadDeadline(time.Time{})
	o, err := net.Dial("tcp", origin)
	if err != nil {
		return err
	}
	defer o.Close()
	if _, err := io.Copy(c, o); err != nil {
		return err
	}
	c.Close()
	<-term
	return nil
}
