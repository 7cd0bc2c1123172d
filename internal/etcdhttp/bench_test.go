package etcdhttp

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
)

// BenchmarkRequest compares one request through the JSON gateway (this
// package) with the same request through etcd's gRPC client, against the
// same embedded etcd in the same run:
//
//	go test -run '^$' -bench Request -benchtime 1000x -count 3 ./internal/etcdhttp/
func BenchmarkRequest(b *testing.B) {
	eps := etcdtest.Start(b)
	ctx := context.Background()
	hc, err := New(Config{Endpoints: eps})
	if err != nil {
		b.Fatal(err)
	}
	defer hc.Close()
	gc, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer gc.Close()
	val := string(make([]byte, 1024))
	b.Run("put/gateway", func(b *testing.B) {
		for i := range b.N {
			if _, err := hc.Put(ctx, fmt.Sprintf("/b/%d", i%100), val, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("put/grpc", func(b *testing.B) {
		for i := range b.N {
			if _, err := gc.Put(ctx, fmt.Sprintf("/b/%d", i%100), val); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("range100/gateway", func(b *testing.B) {
		for range b.N {
			if _, err := hc.GetPrefix(ctx, "/b/", false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("range100/grpc", func(b *testing.B) {
		for range b.N {
			if _, err := gc.Get(ctx, "/b/", clientv3.WithPrefix()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
