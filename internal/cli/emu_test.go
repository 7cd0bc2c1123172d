package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

func TestEmuUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"emu"}, 2, "missing subcommand"},
		{[]string{"emu", "bogus"}, 2, `unknown subcommand "bogus"`},
		{[]string{"emu", "up"}, 2, "exactly one WORLD.yaml"},
		{[]string{"emu", "up", "/nonexistent/world.yaml"}, 1, "no such file"},
		{[]string{"emu", "exec", "client"}, 2, "HOST -- CMD"},
		{[]string{"emu", "down", "a", "b"}, 2, "usage"},
		{[]string{"emu", "check", "-only", "nope"}, 2, `unknown section "nope"`},
		{[]string{"emu", "check", "extra"}, 2, "no arguments"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Run(context.Background(), tt.args, strings.NewReader(""), &out, &errb)
			if code != tt.code {
				t.Errorf("Run(%q) = %d; want %d (stderr %q)", tt.args, code, tt.code, errb.String())
			}
			if !strings.Contains(errb.String(), tt.want) {
				t.Errorf("Run(%q) stderr = %q; want it to contain %q", tt.args, errb.String(), tt.want)
			}
		})
	}
}

func TestEmuUpBadSpec(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/w.yaml"
	if err := os.WriteFile(path, []byte("hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: c, delay_ms: 1}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"emu", "up", path}, strings.NewReader(""), &out, &errb); code != 1 {
		t.Errorf("emu up with a bad spec = %d; want 1", code)
	}
	if !strings.Contains(errb.String(), `unknown host "c"`) {
		t.Errorf("stderr %q; want the spec error", errb.String())
	}
}
