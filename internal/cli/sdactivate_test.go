package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/activation"
	"github.com/mosto-net/mosto/internal/probe"
	"github.com/mosto-net/mosto/internal/testenv"
)

// systemdActivate returns the path of systemd's own socket activator,
// systemd-socket-activate (Debian package systemd), or "" (the tests then
// measure with activation.Activator only; under MOSTO_REQUIRE_PRIV=1 they
// fail: .ci/run installs it).
func systemdActivate(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		testenv.Partial(t, "systemd-socket-activate not installed (Debian package systemd)")
		return ""
	}
	return p
}

// sdStart is one start through systemd-socket-activate: handed the held
// sockets through LISTEN_FDS, it waits until one of them is readable and
// then execs the command in its own process with LISTEN_PID (its pid),
// LISTEN_FDS and LISTEN_FDNAMES set, the code systemd runs in the service
// process it forked. Unlike activation.Activator (Go's fork and exec of
// /bin/sh, which execs the command) nothing runs between the connection
// and the command's exec but systemd's epoll wake-up.
type sdStart struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{} // closed when the process was waited for
	err    error         // its exit, once done
}

// startSD starts systemd-socket-activate at ssa with socks and the command
// argv (env: extra variables for the command, which otherwise gets only
// TERM, PATH, USER and HOME); wrap makes the process (a plain exec.Command,
// or one in an emulated host's namespace). It returns once the activator
// listens, before anything connects.
func startSD(t *testing.T, ssa string, socks []activation.Passed, env, argv []string, wrap func(name string, args ...string) *exec.Cmd) *sdStart {
	t.Helper()
	names := make([]string, len(socks))
	files := make([]*os.File, len(socks))
	for i, s := range socks {
		names[i], files[i] = s.Name, s.File
	}
	// LISTEN_PID must be the activator's pid: sh exports its own and execs.
	args := []string{"-c", `export LISTEN_PID=$$; exec "$0" "$@"`, ssa, "--fdname=" + strings.Join(names, ":")}
	for _, e := range env {
		args = append(args, "-E", e)
	}
	cmd := wrap("/bin/sh", append(args, argv...)...)
	cmd.Env = append(os.Environ(), "LISTEN_FDS="+strconv.Itoa(len(socks)))
	cmd.ExtraFiles = files
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		w.Close()
		r.Close()
		t.Fatalf("start %s: %v", ssa, err)
	}
	w.Close()
	s := &sdStart{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	listening := make(chan struct{})
	go func() {
		defer close(s.done)
		defer func() { s.err = cmd.Wait() }()
		defer r.Close()
		sc := bufio.NewScanner(r)
		n := 0
		for sc.Scan() {
			s.stderr.Write(append(sc.Bytes(), '\n'))
			// "Listening on ADDR as FD." once per socket, just before its
			// epoll registration; a connection queued before that still
			// wakes the activator (level-triggered).
			if strings.HasPrefix(sc.Text(), "Listening on ") {
				if n++; n == len(socks) {
					close(listening)
				}
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			cmd.Process.Kill()
			<-s.done
		}
	})
	select {
	case <-listening:
	case <-s.done:
		t.Fatalf("%s exited before listening: %v: %s", ssa, s.err, s.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not listening after 30 s: %s", ssa, s.stderr.String())
	}
	return s
}

// stop sends SIGTERM (to the activated command, which has the activator's
// pid) and waits for its exit.
func (s *sdStart) stop(t *testing.T) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		if s.err != nil {
			t.Fatalf("activated command exited with %v: %s", s.err, s.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("activated command did not exit 30 s after SIGTERM: %s", s.stderr.String())
	}
}

// TestProxySocketActivatedProbe: the datagram socket of socket activation
// (ListenDatagram= in deploy/systemd/mosto-proxy@.socket) end to end. The
// activator holds a stream socket and a datagram socket, both named "hop"
// as the unit's single FileDescriptorName= names every socket of the unit;
// the first probe datagram starts `mosto proxy`, whose agent answers it on
// the passed socket (it never binds probe_listen), and the same process
// relays the service's connections from the passed stream socket. A proxy
// without a controller section refuses the datagram socket by name.
func TestProxySocketActivatedProbe(t *testing.T) {
	origin := greeter(t)
	tcp, tcpAddr, err := activation.ListenTCP("service-web", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.File.Close()
	udp, udpAddr, err := activation.ListenUDP("hop", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.File.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "proxy.yaml")
	// The controller is unreachable: the agent keeps retrying its
	// registration while its measurement endpoint serves.
	y := fmt.Sprintf("id: a\nservices: [{name: web, listen: '%s', origin: '%s'}]\ndestinations: {allow: ['127.0.0.1']}\ntimeouts: {drain: 1s}\n"+
		"controller: {url: 'http://127.0.0.1:1', data_dir: '%s', hop_addr: '127.0.0.1:7', probe_listen: '%s', probe_addr: '%s'}\n",
		tcpAddr, origin, filepath.Join(dir, "data"), udpAddr, udpAddr)
	if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	argv, env := activationArgv(t, cfgPath)
	socks := []activation.Passed{tcp, udp}
	// start runs the activator (systemd's when installed) for one start of
	// argv; stop(true) sends the proxy SIGTERM, stop(false) waits for it to
	// exit by itself; both return its exit.
	start := func(argv []string) (*syncBuffer, func(term bool) error) {
		if ssa := systemdActivate(t); ssa != "" {
			sd := startSD(t, ssa, socks, env, argv, exec.Command)
			return sd.stderr, func(term bool) error {
				if term {
					sd.cmd.Process.Signal(syscall.SIGTERM)
				}
				select {
				case <-sd.done:
					return sd.err
				case <-time.After(60 * time.Second):
					return errors.New("did not exit within 60 s")
				}
			}
		}
		t.Log("systemd-socket-activate not installed: activation.Activator starts the proxy")
		stderr := &syncBuffer{}
		procs := make(chan *os.Process, 8)
		exits := make(chan error, 8)
		a := &activation.Activator{
			Sockets: socks,
			Command: func() *exec.Cmd {
				c := exec.Command(argv[0], argv[1:]...)
				c.Env, c.Stderr = append(os.Environ(), env...), stderr
				return c
			},
			StartLimit: 1,
			OnStart:    func(_ time.Time, p *os.Process) { procs <- p },
			OnExit:     func(err error) { exits <- err },
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.Run(ctx); close(done) }()
		return stderr, func(term bool) error {
			defer func() { cancel(); <-done }()
			select {
			case p := <-procs:
				if term {
					p.Signal(syscall.SIGTERM)
				}
			case <-time.After(60 * time.Second):
				return errors.New("never started")
			}
			select {
			case err := <-exits:
				return err
			case <-time.After(60 * time.Second):
				return errors.New("did not exit within 60 s")
			}
		}
	}

	stderr, stop := start(argv)
	// The first datagram starts the proxy; its agent answers it.
	m := probe.UDPEcho{Timeout: 60 * time.Second}
	if _, err := m.Measure(context.Background(), udpAddr.String()); err != nil {
		stop(true)
		t.Fatalf("probe to the passed datagram socket: %v (proxy: %s)", err, stderr.String())
	}
	if _, err := firstLine(tcpAddr.String()); err != nil {
		t.Errorf("service connection through the passed stream socket: %v", err)
	}
	if err := stop(true); err != nil {
		t.Errorf("proxy exit: %v: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "probe=true") {
		t.Errorf("the proxy did not log taking the datagram socket as its probe endpoint: %s", stderr.String())
	}

	// Without a controller section the datagram socket has no taker: the
	// proxy started by a datagram exits with an error naming it.
	argv, _ = activationArgv(t, proxyConfig(t, tcpAddr.String(), origin))
	stderr, stop = start(argv)
	c, err := net.Dial("udp", udpAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("wake up"))
	c.Close()
	if err := stop(false); err == nil || !strings.Contains(stderr.String(), "only the measurement endpoint of a proxy with a controller section") {
		t.Errorf("proxy without a controller section: exit %v, stderr %q; want an error about the datagram socket", err, stderr.String())
	}
}
