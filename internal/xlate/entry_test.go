package xlate

import (
	"errors"
	"testing"
)

func asRefused(err error, re **RefusedError) bool { return errors.As(err, re) }

func TestPairRefusals(t *testing.T) {
	base := func() (SockState, SockState) {
		a := SockState{Local: ap("10.1.0.2:80"), Remote: ap("10.1.0.1:1000"), Timestamps: true, SACK: true, AdvMSS: 1460, SndMSS: 1448}
		b := SockState{Local: ap("10.2.0.2:2000"), Remote: ap("10.2.0.1:80"), Timestamps: true, SACK: true, AdvMSS: 1460, SndMSS: 1448}
		return a, b
	}
	cases := []struct {
		name string
		mod  func(a, b *SockState)
		want Reason
	}{
		{"unacked", func(a, b *SockState) { a.Unacked = 1 }, ReasonBusy},
		{"unread", func(a, b *SockState) { b.InQ = 10 }, ReasonBusy},
		{"unsent", func(a, b *SockState) { b.OutQ = 10 }, ReasonBusy},
		{"timestamps one leg", func(a, b *SockState) { b.Timestamps = false }, ReasonTimestamps},
		{"usec timestamps", func(a, b *SockState) { a.USecTS = true }, ReasonTimestamps},
		{"sack one leg", func(a, b *SockState) { a.SACK = false }, ReasonSACK},
		{"family", func(a, b *SockState) { b.Local = ap("[fd00::2]:2000"); b.Remote = ap("[fd00::1]:80") }, ReasonFamily},
		{"mss", func(a, b *SockState) { b.SndMSS = 1200 }, ReasonMSS},
		{"peer accepts less", func(a, b *SockState) { b.PeerMSS = 1000; b.PathMSS = 1460 }, ReasonMSS},
		{"path MTU smaller", func(a, b *SockState) { a.PeerMSS = 1460; a.PathMSS = 1240; b.PeerMSS = 1460 }, ReasonMSS},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := base()
			c.mod(&a, &b)
			_, _, err := Pair(a, b)
			var re *RefusedError
			if !errors.As(err, &re) || re.Reason != c.want {
				t.Errorf("Pair = %v, want refusal %s", err, c.want)
			}
		})
	}
	a, b := base()
	if _, _, err := Pair(a, b); err != nil {
		t.Errorf("compatible legs refused: %v", err)
	}
	// lo: the send MSS is capped at half the peer's largest window; what
	// the peers accept and the path carry is what counts.
	a, b = base()
	for _, s := range []*SockState{&a, &b} {
		s.AdvMSS, s.SndMSS, s.PeerMSS, s.PathMSS = 65483, 32768, 65483, 65496
	}
	if _, _, err := Pair(a, b); err != nil {
		t.Errorf("loopback legs refused: %v", err)
	}
}
