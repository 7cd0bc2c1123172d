package cli

import (
	"reflect"
	"testing"
)

func TestParseFlagsPositionalsAndTerminator(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantPos []string
		wantV   bool
	}{
		{"flags first", []string{"-v", "a", "b"}, []string{"a", "b"}, true},
		{"flags after positional", []string{"a", "-v", "b"}, []string{"a", "b"}, true},
		{"terminator first", []string{"--", "-v", "x"}, []string{"-v", "x"}, false},
		{"terminator after positional", []string{"host", "--", "cmd", "-c", "x"}, []string{"host", "cmd", "-c", "x"}, false},
		{"flag then terminator", []string{"-v", "host", "--", "-v"}, []string{"host", "-v"}, true},
		{"none", nil, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := &Env{Stderr: testWriter{t}}
			fs := newFlagSet(env, "t")
			v := fs.Bool("v", false, "")
			pos, err := parseFlags(fs, tt.args)
			if err != nil {
				t.Fatalf("parseFlags(%q) error %v", tt.args, err)
			}
			if !reflect.DeepEqual(pos, tt.wantPos) || *v != tt.wantV {
				t.Errorf("parseFlags(%q) = %q, v=%v; want %q, v=%v", tt.args, pos, *v, tt.wantPos, tt.wantV)
			}
		})
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
