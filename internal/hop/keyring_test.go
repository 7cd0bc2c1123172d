package hop

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var testMembers = []string{"fep-a", "fep-b", "fep-c", "fep-d"}

// fepKey derives FEP self's share of master the way the controller does.
func fepKey(master Key, self string, members []string) FEPKey {
	k := FEPKey{ID: master.ID, Recv: RecvKey(master.Secret, self), Send: map[string][]byte{}}
	for _, m := range members {
		if m != self {
			k.Send[m] = SendKey(RecvKey(master.Secret, m), self)
		}
	}
	return k
}

func fepKeyring(t testing.TB, master Key, self string) *Keyring {
	t.Helper()
	kr, err := NewFEPKeyring(self, fepKey(master, self, testMembers), nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

var testMaster = Key{ID: 7, Secret: []byte("0123456789abcdef0123456789abcdef")}

// TestGoldenPairKey recomputes the golden header's MAC from the formula of
// docs/hop.md with crypto/hmac alone.
func TestGoldenPairKey(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "sample.hex"))
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	for _, line := range strings.Split(string(raw), "\n") {
		if len(line) < 10 {
			continue
		}
		hexPart := line[10:min(len(line), 58)]
		x, err := hex.DecodeString(strings.ReplaceAll(hexPart, " ", ""))
		if err != nil {
			t.Fatalf("golden line %q: %v", line, err)
		}
		b = append(b, x...)
	}
	mac := func(key []byte, parts ...string) []byte {
		m := hmac.New(sha256.New, key)
		for _, p := range parts {
			m.Write([]byte(p))
		}
		return m.Sum(nil)
	}
	recvB := mac(testMaster.Secret, "mosto hop recv v1\x00", "fep-b")
	kAB := mac(recvB, "mosto hop send v1\x00", "fep-a")
	m := hmac.New(sha256.New, kAB)
	m.Write(b[:len(b)-32])
	if !bytes.Equal(m.Sum(nil), b[len(b)-32:]) {
		t.Fatal("golden header's MAC is not HMAC(K(fep-a->fep-b)) of docs/hop.md")
	}
}

// TestPerFEPSigning: item 11 of issue 13. A FEP signs only as itself, and a
// header verifies only at its receiver; a FEP's keys forge nothing else.
func TestPerFEPSigning(t *testing.T) {
	a, b, c := fepKeyring(t, testMaster, "fep-a"), fepKeyring(t, testMaster, "fep-b"), fepKeyring(t, testMaster, "fep-c")
	master := testKeyring(t)
	h := sampleHeader() // route fep-a fep-b fep-c, hop 1: from fep-a to fep-b
	fromA := mustMarshal(t, h, a)
	if !bytes.Equal(fromA, mustMarshal(t, h, master)) {
		t.Fatal("a FEP keyring and the overlay secret sign the same header differently")
	}
	if got, err := Read(bytes.NewReader(fromA), b, t0, time.Minute); err != nil || !equalHeader(got, h) {
		t.Fatalf("fep-b refused fep-a's header: %v", err)
	}
	// fep-b forwards as TrP: hop 2, from fep-b to fep-c.
	fwd := *h
	fwd.Hop = 2
	if _, err := Read(bytes.NewReader(mustMarshal(t, &fwd, b)), c, t0, time.Minute); err != nil {
		t.Fatalf("fep-c refused fep-b's forwarded header: %v", err)
	}

	// A compromised fep-c tries to pass a header as fep-a's to fep-b.
	if _, err := h.Marshal(c); err == nil {
		t.Error("fep-c's keyring signed a header from fep-a")
	}
	cKey := fepKey(testMaster, "fep-c", testMembers)
	forgeries := map[string][]byte{
		"c's send key to b":  cKey.Send["fep-b"],
		"c's receive key":    cKey.Recv,
		"c's send key to a":  cKey.Send["fep-a"],
		"key derived from c": SendKey(cKey.Recv, "fep-a"),
	}
	for name, secret := range forgeries {
		t.Run("forged with "+name, func(t *testing.T) {
			forger, err := NewFEPKeyring("fep-a", FEPKey{ID: testMaster.ID, Recv: cKey.Recv, Send: map[string][]byte{"fep-b": secret}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Read(bytes.NewReader(mustMarshal(t, h, forger)), b, t0, time.Minute)
			if !errors.Is(err, ErrAuth) {
				t.Errorf("fep-b accepted a header forged with %s: %v", name, err)
			}
		})
	}
	// fep-c rewrites the client address or route of a header it carries
	// and re-signs as itself: a header from fep-c as route[hop-1]=fep-a is
	// refused; only a header naming fep-c as the sender passes.
	lie := *h
	lie.Route = []string{"fep-c", "fep-b", "fep-d"}
	if _, err := Read(bytes.NewReader(mustMarshal(t, &lie, c)), b, t0, time.Minute); err != nil {
		t.Errorf("fep-b refused fep-c's own header: %v", err)
	}

	// A header addressed to fep-b, presented to fep-c (or to fep-a).
	for name, other := range map[string]*Keyring{"fep-c": c, "fep-a": a} {
		if _, err := Read(bytes.NewReader(fromA), other, t0, time.Minute); !errors.Is(err, ErrAuth) {
			t.Errorf("%s accepted a header for fep-b: %v", name, err)
		}
	}
	// No send key: a member not in the table.
	nowhere := *h
	nowhere.Route = []string{"fep-a", "fep-x"}
	if _, err := nowhere.Marshal(a); err == nil {
		t.Error("fep-a signed a header to fep-x, for which it has no key")
	}
	// Replayed: the replay cache refuses the second copy whatever the keys.
	rc := NewReplayCache(time.Minute, 16)
	for i := 0; i < 2; i++ {
		got, err := Read(bytes.NewReader(fromA), b, t0, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		err = rc.Check(got)
		if i == 1 && !errors.Is(err, ErrReplay) {
			t.Errorf("replayed header: %v; want ErrReplay", err)
		}
	}
	// Hop 0 has no sender: refused both ways.
	zero := *h
	zero.Hop = 0
	if _, err := zero.Marshal(master); err == nil {
		t.Error("Marshal signed a header with hop 0")
	}
}

// TestFEPKeyRotation: the two-phase rotation with FEP keyrings. Every
// pair of consecutive phases accepts each other's headers.
func TestFEPKeyRotation(t *testing.T) {
	k1 := Key{ID: 1, Secret: []byte("first-secret-first-secret")}
	k2 := Key{ID: 2, Secret: []byte("second-secret-second-secret")}
	phase := func(self string, p int) *Keyring {
		t.Helper()
		var kr *Keyring
		var err error
		switch p {
		case 0: // before
			kr, err = NewFEPKeyring(self, fepKey(k1, self, testMembers), nil)
		case 1: // k2 published, accept only
			kr, err = NewFEPKeyring(self, fepKey(k1, self, testMembers), nil, fepKey(k2, self, testMembers))
		case 2: // switched
			p := fepKey(k1, self, testMembers)
			kr, err = NewFEPKeyring(self, fepKey(k2, self, testMembers), &p)
		case 3: // after
			kr, err = NewFEPKeyring(self, fepKey(k2, self, testMembers), nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		return kr
	}
	h := sampleHeader()
	for sp := 0; sp < 4; sp++ {
		for rp := 0; rp < 4; rp++ {
			_, err := Read(bytes.NewReader(mustMarshal(t, h, phase("fep-a", sp))), phase("fep-b", rp), t0, time.Minute)
			ok := (sp <= 1 && rp <= 2) || (sp >= 2 && rp >= 1) // k1 signers, k2 signers; only 0<->3 differ by two phases
			if ok != (err == nil) {
				t.Errorf("sender phase %d, receiver phase %d: %v; want ok=%v", sp, rp, err, ok)
			}
		}
	}
	if _, err := NewFEPKeyring("fep-a", FEPKey{ID: 1, Recv: []byte("short")}, nil); err == nil {
		t.Error("NewFEPKeyring accepted a 5-byte receive key")
	}
	if _, err := NewFEPKeyring("bad id", fepKey(k1, "x", testMembers), nil); err == nil {
		t.Error("NewFEPKeyring accepted an id with a space")
	}
}

func BenchmarkReadFEP(b *testing.B) {
	kr := fepKeyring(b, testMaster, "fep-b")
	buf := mustMarshal(b, sampleHeader(), fepKeyring(b, testMaster, "fep-a"))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Read(bytes.NewReader(buf), kr, t0, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
