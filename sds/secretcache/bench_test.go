package secretcache_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/secretcache"
)

func benchManager(b *testing.B, kt certs.KeyType) *secretcache.Manager {
	b.Helper()
	clk := clock.NewFake(epoch)
	ca := newTestCA(b, clk)
	ca.entered = make(chan struct{}, 1<<20)
	m, err := secretcache.New(secretcache.Config{Signer: ca, ID: testID, KeyType: kt, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkSecretCached is the hot path of every SDS request for default.
func BenchmarkSecretCached(b *testing.B) {
	m := benchManager(b, certs.ECP256)
	ctx := context.Background()
	if _, err := m.Secret(ctx, secretcache.DefaultName); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := m.Secret(ctx, secretcache.DefaultName); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRotate is one forced rotation (key, CSR, in-process signature,
// verification, swap) pushed to n watchers, each a non-blocking channel
// send as an SDS stream would do.
func BenchmarkRotate(b *testing.B) {
	for _, n := range []int{0, 10000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			m := benchManager(b, certs.ECP256)
			ctx := context.Background()
			for range n {
				ch := make(chan struct{}, 1)
				m.Watch(secretcache.DefaultName, func(*secretcache.Secret) {
					select {
					case ch <- struct{}{}:
					default:
					}
				})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := m.Rotate(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWatch is registering and cancelling one watcher among 10,000.
func BenchmarkWatch(b *testing.B) {
	m := benchManager(b, certs.ECP256)
	for range 10000 {
		m.Watch(secretcache.DefaultName, func(*secretcache.Secret) {})
	}
	b.ReportAllocs()
	for b.Loop() {
		cancel := m.Watch(secretcache.DefaultName, func(*secretcache.Secret) {})
		cancel()
	}
}
