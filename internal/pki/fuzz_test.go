package pki

import (
	"strings"
	"testing"
)

func FuzzParseToken(f *testing.F) {
	f.Add("mosto1.0123456789ab.0123456789abcdef0123456789abcdef." + strings.Repeat("ab", 32))
	f.Add("mosto1...")
	f.Add("")
	f.Add("mosto1.0123456789AB.0123456789abcdef0123456789abcdef." + strings.Repeat("ab", 32))
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			return
		}
		back, err := ParseToken(tok.String())
		if err != nil || back != tok {
			t.Fatalf("round trip of %q: %v, %v", s, back, err)
		}
	})
}

func FuzzParseOverlayKeys(f *testing.F) {
	f.Add(strings.Repeat("ab", 32), "")
	f.Add(strings.Repeat("ab", 32), strings.Repeat("cd", 32))
	f.Add("zz", "")
	f.Fuzz(func(t *testing.T, cur, prev string) {
		ks, err := ParseOverlayKeys(cur, prev)
		if err != nil {
			return
		}
		if err := ks.Validate(); err != nil {
			t.Fatalf("parsed keys do not validate: %v", err)
		}
	})
}
