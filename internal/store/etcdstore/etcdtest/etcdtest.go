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

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start starts etcd and returns its client endpoints.
func Start(tb testing.TB) []string {
	tb.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		eps, err := start(tb)
		if err == nil {
			return eps
		}
		lastErr = err
	}
	tb.Fatalf("start embedded etcd: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start(tb testing.TB) ([]string, error) {
	cp, err := freePort()
	if err != nil {
		return nil, err
	}
	pp, err := freePort()
	if err != nil {
		return nil, err
	}
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", cp))
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
