package clitest

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/mosto-net/mosto/internal/cli"
)

// childEnv, set to 1, makes Main run the CLI instead of the tests.
const childEnv = "MOSTO_CLITEST_CHILD"

// Main is a TestMain: in a process started with Mosto's command and
// environment it runs cli.Run on the arguments (SIGTERM and interrupt
// cancel it) and exits with its code; otherwise it runs the tests.
func Main(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// Mosto returns the command (this test binary) and the extra environment
// that run it as the mosto binary, in a test binary whose TestMain is Main.
func Mosto(t testing.TB) (cmd, env []string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe}, []string{childEnv + "=1"}
}
