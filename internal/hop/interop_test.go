package hop

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestHAProxyInterop checks the wire format against a reference PROXY v2
// implementation: HAProxy accepts a mosto hop header (custom TLVs and all)
// and a plain header from AppendPlainV2 with accept-proxy, and re-sends the
// addresses it parsed to the origin with send-proxy-v2, followed by the
// payload alone.
func TestHAProxyInterop(t *testing.T) {
	testenv.CheckLeaks(t)
	if testing.Short() {
		t.Skip("starts haproxy")
	}
	bin := testenv.RequireCommand(t, "haproxy")
	kr := testKeyring(t)

	origin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { origin.Close() })
	front := testenv.FreeAddr(t)
	conf := fmt.Sprintf(`global
    log stderr format raw local0 err
defaults
    mode tcp
    timeout connect 5s
    timeout client 10s
    timeout server 10s
frontend f
    bind %s accept-proxy
    default_backend b
backend b
    server origin %s send-proxy-v2
`, front, origin.Addr())
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(t.TempDir(), "haproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() }) // after haproxy is killed (cleanups run last first)
	cmd := exec.Command(bin, "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	waitListening(t, front, out)

	h := sampleHeader()
	signed := mustMarshal(t, h, kr)
	h6 := sampleHeader()
	h6.Source = netip.MustParseAddrPort("[2001:db8::10]:40001")
	h6.Dest = netip.MustParseAddrPort("[2001:db8::7]:8443")
	signed6 := mustMarshal(t, h6, kr)
	tests := []struct {
		name     string
		header   []byte
		src, dst netip.AddrPort
	}{
		{"hop header tcp4", signed, h.Source, h.Dest},
		{"hop header tcp6", signed6, h6.Source, h6.Dest},
		{"plain tcp4", AppendPlainV2(nil, h.Source, h.Dest), h.Source, h.Dest},
		{"plain tcp6", AppendPlainV2(nil, h6.Source, h6.Dest), h6.Source, h6.Dest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", front)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			payload := []byte("payload after the header")
			if _, err := c.Write(append(append([]byte(nil), tt.header...), payload...)); err != nil {
				t.Fatal(err)
			}
			c.(*net.TCPConn).CloseWrite()

			origin.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
			oc, err := origin.Accept()
			if err != nil {
				t.Fatalf("haproxy did not connect to the origin (header refused?): %v\n%s", err, readAll(out))
			}
			defer oc.Close()
			oc.SetDeadline(time.Now().Add(10 * time.Second))
			src, dst, err := readPlainV2(oc)
			if err != nil {
				t.Fatalf("origin: %v", err)
			}
			if src != tt.src || dst != tt.dst {
				t.Errorf("haproxy parsed %v -> %v; want %v -> %v", src, dst, tt.src, tt.dst)
			}
			rest, err := io.ReadAll(oc)
			if err != nil || !bytes.Equal(rest, payload) {
				t.Errorf("origin payload = %q, %v; want %q", rest, err, payload)
			}
		})
	}
}

// readPlainV2 parses the PROXY v2 header HAProxy sends (TLVs skipped).
func readPlainV2(r io.Reader) (src, dst netip.AddrPort, err error) {
	var fixed [16]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return src, dst, err
	}
	if [12]byte(fixed[:12]) != signature || fixed[12] != verCmdProxy {
		return src, dst, fmt.Errorf("not a PROXY v2 PROXY header: %x", fixed)
	}
	body := make([]byte, binary.BigEndian.Uint16(fixed[14:]))
	if _, err := io.ReadFull(r, body); err != nil {
		return src, dst, err
	}
	switch fixed[13] {
	case famTCP4:
		src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[0:4])), binary.BigEndian.Uint16(body[8:]))
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[4:8])), binary.BigEndian.Uint16(body[10:]))
	case famTCP6:
		src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[0:16])), binary.BigEndian.Uint16(body[32:]))
		dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[16:32])), binary.BigEndian.Uint16(body[34:]))
	default:
		return src, dst, fmt.Errorf("family 0x%02x", fixed[13])
	}
	return src, dst, nil
}

func readAll(f *os.File) string {
	b, _ := os.ReadFile(f.Name())
	return string(b)
}

func waitListening(t *testing.T, addr string, out *os.File) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			// A bare connect without a header: haproxy drops it.
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy not listening on %s: %v\n%s", addr, err, readAll(out))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
