package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// mostoBin is the mosto binary TestMain built for the tests that run it
// as a process (bench proxy runs mosto proxies as child processes).
var mostoBin string

// TestMain builds the mosto binary once (without -race: it is the system
// under test, as shipped) for every test of this package.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "mosto-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	mostoBin = filepath.Join(dir, "mosto")
	build := exec.Command(goBin(), "build", "-o", mostoBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "go build mosto: %v\n", err)
		return 1
	}
	return m.Run()
}
