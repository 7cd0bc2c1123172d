package clitest_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/cli/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m) }

// TestMostoRunsCLI runs `mosto help` through the command Mosto returns:
// the child runs the CLI (its usage names the subcommands), not the tests.
func TestMostoRunsCLI(t *testing.T) {
	cmd, env := clitest.Mosto(t)
	c := exec.Command(cmd[0], append(cmd[1:], "plan", "--help")...)
	c.Env = append(c.Environ(), env...)
	out, _ := c.CombinedOutput()
	if !strings.Contains(string(out), "mosto plan") || strings.Contains(string(out), "PASS") {
		t.Fatalf("child output:\n%s\nwant mosto plan's usage, not a test run", out)
	}
}
