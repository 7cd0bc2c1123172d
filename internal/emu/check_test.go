package emu

import (
	"context"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/testenv"
)

func TestCheckUnknownSection(t *testing.T) {
	var b strings.Builder
	err := Check(context.Background(), &b, CheckOptions{Sections: []string{"bogus"}})
	if err == nil || !strings.Contains(err.Error(), "unknown section") {
		t.Errorf("Check(bogus) = %v; want an unknown section error", err)
	}
}

func TestCheckReorderSection(t *testing.T) {
	testenv.RequirePrivileged(t)
	var b strings.Builder
	if err := Check(context.Background(), &b, CheckOptions{Sections: []string{"reorder"}, Quick: true}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log(out)
	if strings.Contains(out, "OUT") || strings.Count(out, "ok") != 3 {
		t.Errorf("reorder section:\n%s\nwant three ok rows", out)
	}
}
