package xagent

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate"
)

// fakeXlate records installs; entries whose In destination port is 666 are
// refused.
type fakeXlate struct {
	mu        sync.Mutex
	installed map[xlate.Tuple]xlate.Entry
	removed   chan xlate.Tuple
	got       chan xlate.Entry
}

func newFake() *fakeXlate {
	return &fakeXlate{installed: map[xlate.Tuple]xlate.Entry{}, removed: make(chan xlate.Tuple, 8), got: make(chan xlate.Entry, 8)}
}

func (f *fakeXlate) InstallEgress(e xlate.Entry) error {
	defer func() { f.got <- e }()
	if e.In.Dst.Port() == 666 {
		return errors.New("refused for the test")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.installed[e.In] = e
	return nil
}

func (f *fakeXlate) RemoveEgress(in xlate.Tuple) bool {
	f.removed <- in
	return true
}

var testKey = []byte("0123456789abcdef0123")

func entry(sport uint16) xlate.Entry {
	return xlate.Entry{
		In:     xlate.Tuple{Src: netip.MustParseAddrPort("10.0.0.3:8080"), Dst: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), sport)},
		Out:    xlate.Tuple{Src: netip.MustParseAddrPort("10.0.0.2:80"), Dst: netip.MustParseAddrPort("10.0.0.1:40000")},
		SeqAdd: 7, AckAdd: 9, Timestamps: true, TSOffset: 123456, InWScale: 7, OutWScale: 9, Ifindex: 5, Remote: true,
	}
}

// start runs an agent with key on loopback and a placer with pkey for
// surrogate 10.0.0.3; stop ends both.
func start(t *testing.T, key, pkey []byte) (*Agent, *fakeXlate, *Placer, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fx := newFake()
	ag := &Agent{Key: key, Xlate: fx}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { ag.Serve(ctx, ln) })
	p, err := NewPlacer(PlacerConfig{Key: pkey, Agents: map[netip.Addr]string{netip.MustParseAddr("10.0.0.3"): ln.Addr().String()}, Retry: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p.Start(ctx)
	stop := func() { cancel(); p.Wait(); wg.Wait() }
	t.Cleanup(stop)
	return ag, fx, p, stop
}

func TestPlace(t *testing.T) {
	testenv.CheckLeaks(t)
	ag, fx, p, _ := start(t, testKey, testKey)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	sur := netip.MustParseAddr("10.0.0.3")
	if p.Ready(netip.MustParseAddr("10.0.0.4")) || p.Place(netip.MustParseAddr("10.0.0.4"), entry(1), func() {}) {
		t.Error("a surrogate without an agent is ready")
	}
	released := make(chan xlate.Tuple, 4)
	rel := func(e xlate.Entry) func() { return func() { released <- e.In } }
	e := entry(50000)
	if !p.Place(sur, e, rel(e)) {
		t.Fatal("Place failed")
	}
	got := <-fx.got
	// Same kernel (boot id): the timestamp offset is sent as is; the
	// agent's routes decide the device; the agent's copy translates.
	want := e
	want.Ifindex, want.Remote = 0, false
	if got != want {
		t.Errorf("agent installed %+v, want %+v", got, want)
	}
	bad := entry(666)
	if !p.Place(sur, bad, rel(bad)) {
		t.Fatal("Place failed")
	}
	select {
	case in := <-released:
		if in != bad.In {
			t.Errorf("released %v, want the refused %v", in, bad.In)
		}
	case <-ctx.Done():
		t.Fatal("a refused entry was not released")
	}
	p.Unplace(sur, e.In)
	if in := <-fx.removed; in != e.In {
		t.Errorf("agent removed %v, want %v", in, e.In)
	}
	if st, ast := p.Stats(), ag.Stats(); st.Placed != 2 || st.Refused != 1 || ast.Installed != 1 || ast.Refused != 1 || ast.AuthFailed != 0 {
		t.Errorf("placer %+v agent %+v", st, ast)
	}
	// A placed entry is released when its agent's connection is lost.
	e2 := entry(50001)
	if !p.Place(sur, e2, rel(e2)) {
		t.Fatal("Place failed")
	}
	<-fx.got
	a := p.agents[sur]
	a.mu.Lock()
	a.conn.Close()
	a.mu.Unlock()
	select {
	case in := <-released:
		if in != e2.In {
			t.Errorf("released %v, want %v", in, e2.In)
		}
	case <-ctx.Done():
		t.Fatal("an entry placed on a lost connection was not released")
	}
	// It reconnects.
	for !p.Ready(sur) {
		if ctx.Err() != nil {
			t.Fatal("no reconnection")
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond)
	}
	if p.Stats().Lost != 1 {
		t.Errorf("stats %+v, want 1 lost", p.Stats())
	}
}

func TestWrongKey(t *testing.T) {
	testenv.CheckLeaks(t)
	ag, fx, p, stop := start(t, testKey, []byte("another key of 16+ bytes"))
	// The agent refuses the router's proof (it retries every 50 ms).
	deadline := time.Now().Add(60 * time.Second)
	for ag.Stats().AuthFailed < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the agent saw no authentication failure")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p.Ready(netip.MustParseAddr("10.0.0.3")) {
		t.Error("a router with the wrong key is connected")
	}
	stop()
	if len(fx.got) != 0 {
		t.Error("something was installed")
	}
}

// Frames: a changed byte, a replayed or reordered frame fail.
func TestFrames(t *testing.T) {
	key := sessionKey(testKey, []byte("a"), []byte("c"))
	w := newFramer(key, dirToAgent, dirToRouter)
	var b []byte
	b = w.appendFrame(b, msgInstall, []byte(`{"id":1}`))
	one := len(b)
	b = w.appendFrame(b, msgRemove, []byte(`{}`))
	r := newFramer(key, dirToRouter, dirToAgent)
	typ, body, err := r.read(bytes.NewReader(b))
	if err != nil || typ != msgInstall || string(body) != `{"id":1}` {
		t.Fatalf("read %d %q %v", typ, body, err)
	}
	// Replay of the first frame.
	if _, _, err := r.read(bytes.NewReader(b[:one])); !errors.Is(err, ErrAuth) {
		t.Errorf("replayed frame: %v, want ErrAuth", err)
	}
	for i := range len(b) - one {
		c := bytes.Clone(b[one:])
		c[i] ^= 1
		r2 := newFramer(key, dirToRouter, dirToAgent)
		r2.rseq = 1
		if _, _, err := r2.read(bytes.NewReader(c)); err == nil {
			t.Errorf("frame with byte %d flipped accepted", i)
		}
	}
	// The other direction's key does not verify.
	r3 := newFramer(key, dirToAgent, dirToRouter)
	if _, _, err := r3.read(bytes.NewReader(b)); !errors.Is(err, ErrAuth) {
		t.Errorf("frame read as the wrong direction: %v", err)
	}
}

func FuzzFrame(f *testing.F) {
	key := sessionKey(testKey, []byte("a"), []byte("c"))
	w := newFramer(key, dirToAgent, dirToRouter)
	f.Add(w.appendFrame(nil, msgInstall, []byte(`{"id":1}`)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add(hello{Mono: 5}.marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		r := newFramer(key, dirToRouter, dirToAgent)
		typ, body, err := r.read(bytes.NewReader(b))
		if err == nil && (len(body) > maxBody || typ == 0 && len(b) < 13+tagLen) {
			t.Fatalf("accepted %d %q", typ, body)
		}
		if h, err := parseHello(b); err == nil && !bytes.Equal(h.marshal(), b) {
			t.Fatal("hello does not round-trip")
		}
	})
}
