package relay

import (
	"net"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/activation"
)

// TestActivatedPoolUnitWideName: systemd names every socket of a socket
// unit with its one FileDescriptorName=, so a unit holding the hop and a
// service listener passes two sockets named hop. Each listener takes its
// own whatever the order; a hop socket on a wrong address is an error.
func TestActivatedPoolUnitWideName(t *testing.T) {
	listen := func() (activation.Socket, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return activation.Socket{Name: "hop", Listener: ln}, ln.Addr().String()
	}
	hop, hopAddr := listen()
	svc, svcAddr := listen()
	for _, order := range [][2]string{{"hop", "service-web"}, {"service-web", "hop"}} {
		p := newActivatedPool([]activation.Socket{svc, hop})
		addrs := map[string]string{"hop": hopAddr, "service-web": svcAddr}
		for _, name := range order {
			ln, err := p.take(name, addrs[name])
			if err != nil || ln == nil {
				t.Fatalf("order %v: take(%s, %s) = %v, %v", order, name, addrs[name], ln, err)
			}
			if got := ln.Addr().String(); got != addrs[name] {
				t.Errorf("order %v: %s took the socket on %s; want %s", order, name, got, addrs[name])
			}
		}
		for i, u := range p.used {
			if !u {
				t.Errorf("order %v: socket %d unused", order, i)
			}
		}
	}
	// One hop socket on another address than the configuration's.
	p := newActivatedPool([]activation.Socket{svc})
	if _, err := p.take("hop", hopAddr); err == nil || !strings.Contains(err.Error(), "listens on") {
		t.Errorf("hop socket on %s for hop.listen %s: err %v; want one naming both", svcAddr, hopAddr, err)
	}
}
