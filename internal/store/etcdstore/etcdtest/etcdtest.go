// Package etcdtest starts a real single-member etcd server
// (go.etcd.io/etcd/server/v3/embed) for tests, in a temporary directory on
// freshly chosen loopback ports, stopped in t.Cleanup.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start starts etcd and returns its client endpoints.
func Start(tb testing.TB) []string {
	tb.Helper()
	return startRetry(tb, nil)
}

// TLSFiles are the PEM files of a TLS etcd started by StartTLS: etcd's CA,
// and a client certificate and key that the CA signed.
type TLSFiles struct {
	CA, Cert, Key string
}

// StartTLS starts etcd serving https on its client URL and requiring a
// client certificate signed by a fresh CA; it returns the endpoints and the
// files a client needs.
func StartTLS(tb testing.TB) ([]string, TLSFiles) {
	tb.Helper()
	files, server, err := writeCerts(tb.TempDir())
	if err != nil {
		tb.Fatalf("etcd test certificates: %v", err)
	}
	return startRetry(tb, &server), files
}

func startRetry(tb testing.TB, tlsInfo *transport.TLSInfo) []string {
	tb.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		eps, err := start(tb, tlsInfo)
		if err == nil {
			return eps
		}
		lastErr = err
	}
	tb.Fatalf("start embedded etcd: %v", lastErr)
	return nil
}

// DeadEndpoint returns an http endpoint on which nothing listens (a port
// just freed): a member that is down.
func DeadEndpoint(tb testing.TB) string {
	tb.Helper()
	p, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", p)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start(tb testing.TB, tlsInfo *transport.TLSInfo) ([]string, error) {
	cp, err := freePort()
	if err != nil {
		return nil, err
	}
	pp, err := freePort()
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if tlsInfo != nil {
		scheme = "https"
	}
	cu, _ := url.Parse(fmt.Sprintf("%s://127.0.0.1:%d", scheme, cp))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", pp))
	cfg := embed.NewConfig()
	cfg.Name = "test"
	cfg.Dir = tb.TempDir()
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.EnableGRPCGateway = true // etcdstore talks to etcd through its JSON gateway
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true
	cfg.AutoCompactionMode = embed.CompactorModeRevision
	cfg.AutoCompactionRetention = "1000"
	cfg.MaxRequestBytes = 8 << 20
	if tlsInfo != nil {
		cfg.ClientTLSInfo = *tlsInfo
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd not ready within 20s")
	}
	tb.Cleanup(e.Close)
	return []string{cu.String()}, nil
}
