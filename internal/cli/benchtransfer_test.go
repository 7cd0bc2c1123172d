package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

func TestBenchTransferUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no world", []string{}, "--world is required"},
		{"bad runs", []string{"--world", "demo", "--runs", "0"}, "--runs"},
		{"bad size", []string{"--world", "demo", "--sizes", "10QB"}, "--sizes"},
		{"bad mode", []string{"--world", "demo", "--modes", "direct,teleport"}, "unknown mode"},
		{"positional", []string{"--world", "demo", "extra"}, "unexpected"},
		{"bad end icw", []string{"--world", "demo", "--end-icw", "-2"}, "--end-icw"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := runBenchTransfer(context.Background(), &Env{Stdout: &out, Stderr: &errb}, tc.args)
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("runBenchTransfer(%q) = %v; want usage error containing %q", tc.args, err, tc.want)
			}
		})
	}
	var out, errb bytes.Buffer
	if err := runBenchTransfer(context.Background(), &Env{Stdout: &out, Stderr: &errb}, []string{"--world", "/nonexistent.yaml"}); err == nil || errors.Is(err, errUsage) {
		t.Errorf("missing world file: %v; want a plain error", err)
	}
}

func TestBenchDispatch(t *testing.T) {
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb}
	if err := runBench(context.Background(), env, nil); !errors.Is(err, errUsage) {
		t.Errorf("bench with no name = %v; want usage error", err)
	}
	if err := runBench(context.Background(), env, []string{"nope"}); !errors.Is(err, errUsage) {
		t.Errorf("bench nope = %v; want usage error", err)
	}
	if err := runBench(context.Background(), env, []string{"transfer"}); err == nil || !strings.Contains(err.Error(), "--world") {
		t.Errorf("bench transfer = %v; want its own usage error", err)
	}
}

func TestDemoUsage(t *testing.T) {
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb}
	for _, args := range [][]string{{"extra"}, {"--runs", "0"}, {"--sizes", ","}} {
		if err := runDemo(context.Background(), env, args); !errors.Is(err, errUsage) {
			t.Errorf("demo %q = %v; want usage error", args, err)
		}
	}
}
