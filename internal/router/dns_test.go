package router

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/mosto-net/mosto/internal/testenv"
)

func TestDNSServer(t *testing.T) {
	testenv.CheckLeaks(t)
	ms := time.Millisecond
	p, err := NewPicker(PickConfig{
		Surrogates: []Surrogate{{"far", "10.0.0.1:80"}, {"near", "10.0.0.2:80"}},
		Locations:  []Location{{netip.MustParsePrefix("127.0.0.0/8"), map[string]time.Duration{"far": 40 * ms, "near": 3 * ms}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDNSServer("cdn.mosto.test", 5, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, pc) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Serve = %v", err)
		}
	}()
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var dd net.Dialer
		return dd.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	defer lcancel()
	addrs, err := res.LookupHost(lctx, "CDN.mosto.test")
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0] != "10.0.0.2" {
		t.Errorf("LookupHost = %v; want the near surrogate 10.0.0.2", addrs)
	}
	if _, err := res.LookupHost(lctx, "other.test"); err == nil {
		t.Error("a name outside the zone resolved")
	}
}

func TestDNSAnswer(t *testing.T) {
	p, _ := NewPicker(PickConfig{Surrogates: []Surrogate{{"a", "10.0.0.1:80"}}})
	d, err := NewDNSServer("cdn.test.", 5, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	query := func(name string, typ dnsmessage.Type, n int) []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
		b.StartQuestions()
		for range n {
			b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
		}
		out, _ := b.Finish()
		return out
	}
	tests := []struct {
		name    string
		q       []byte
		rcode   dnsmessage.RCode
		answers int
	}{
		{"a", query("cdn.test.", dnsmessage.TypeA, 1), dnsmessage.RCodeSuccess, 1},
		{"aaaa", query("cdn.test.", dnsmessage.TypeAAAA, 1), dnsmessage.RCodeSuccess, 0},
		{"outside", query("x.test.", dnsmessage.TypeA, 1), dnsmessage.RCodeRefused, 0},
		{"two questions", query("cdn.test.", dnsmessage.TypeA, 2), dnsmessage.RCodeFormatError, 0},
		{"truncated", query("cdn.test.", dnsmessage.TypeA, 1)[:15], dnsmessage.RCodeFormatError, 0},
	}
	for _, tt := range tests {
		resp := d.Answer(tt.q, netip.MustParseAddr("10.9.9.9"))
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("%s: unpack answer: %v", tt.name, err)
		}
		if m.Header.ID != 7 || !m.Header.Response || m.Header.RCode != tt.rcode || len(m.Answers) != tt.answers {
			t.Errorf("%s: %+v; want rcode %v, %d answers", tt.name, m, tt.rcode, tt.answers)
		}
	}
	if d.Answer([]byte{1, 2, 3}, netip.Addr{}) != nil {
		t.Error("a packet shorter than a header got an answer")
	}
}

func FuzzDNSAnswer(f *testing.F) {
	p, _ := NewPicker(PickConfig{Surrogates: []Surrogate{{"a", "10.0.0.1:80"}}})
	d, err := NewDNSServer("cdn.test.", 5, p, nil)
	if err != nil {
		f.Fatal(err)
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("cdn.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	f.Add(q)
	f.Fuzz(func(t *testing.T, in []byte) {
		resp := d.Answer(in, netip.MustParseAddr("10.9.9.9"))
		if resp == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("answer to %x does not parse: %v", in, err)
		}
		if len(m.Answers) > 1 || len(resp) > 512 {
			t.Fatalf("answer %+v", m)
		}
	})
}
