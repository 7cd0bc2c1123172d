package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

func TestBenchTTSUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"trials", []string{"--trials", "0"}, "--trials"},
		{"only", []string{"--only", "tables,plots"}, "unknown part"},
		{"rows", []string{"--rows", "7"}, "--rows"},
		{"size", []string{"--size", "10QB"}, "--size"},
		{"grid loss", []string{"--grid-loss", "0,100"}, "--grid-loss"},
		{"grid rtts", []string{"--grid-rtts", "x"}, "--grid-rtts"},
		{"rate", []string{"--rate", "0"}, "--rate"},
		{"positional", []string{"extra"}, "unexpected"},
		{"pepsal without binary", []string{"--modes", "e2e,pepsal"}, "--pepsal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := runBenchTTS(context.Background(), &Env{Stdout: &out, Stderr: &errb}, tc.args)
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("runBenchTTS(%q) = %v; want usage error containing %q", tc.args, err, tc.want)
			}
		})
	}
}
