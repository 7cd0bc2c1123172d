package emu

import (
	"regexp"
	"testing"
)

// The hand-written checks agree with the regexps they replace.
var nameChecks = []struct {
	name string
	re   *regexp.Regexp
	fn   func(string) bool
}{
	{"host", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`), validHostName},
	{"congestion", regexp.MustCompile(`^[a-z0-9_]{1,15}$`), validCongestion},
	{"runid", regexp.MustCompile(`^[a-z0-9]{1,6}$`), validRunID},
}

func TestNameChecks(t *testing.T) {
	inputs := []string{"", "a", "A", "_", "-a", "a-b.c_d", "bbr", "cubic", "BBR", "abc123", "abc1234",
		"a\n", "é", "x y", "aaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaa", "0", "9z", "a/b",
		"a23456789012345678901234567890123456789012345678901234567890123",
		"a234567890123456789012345678901234567890123456789012345678901234"}
	for _, c := range nameChecks {
		for _, in := range inputs {
			if got, want := c.fn(in), c.re.MatchString(in); got != want {
				t.Errorf("%s check(%q) = %v; regexp says %v", c.name, in, got, want)
			}
		}
	}
}

func FuzzNameChecks(f *testing.F) {
	for _, s := range []string{"", "a", "bbr", "a-b.c", "abc123x", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		for _, c := range nameChecks {
			if got, want := c.fn(in), c.re.MatchString(in); got != want {
				t.Errorf("%s check(%q) = %v; regexp says %v", c.name, in, got, want)
			}
		}
	})
}
