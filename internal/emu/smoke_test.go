package emu

import (
	"context"
	"testing"
)

func TestSmokeUp(t *testing.T) {
	spec, err := ParseSpec([]byte(`
name: smoke
hosts: [{name: a}, {name: b}]
links: [{a: a, b: b, delay_ms: 20}]
`))
	if err != nil {
		t.Fatal(err)
	}
	w := Start(t, spec)
	out, err := w.Command(context.Background(), "a", "ping", "-c", "5", "-i", "0.2", w.Addr("b").String()).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
