package workloadendpoint_test

import (
	"context"
	"fmt"
	"testing"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
)

// BenchmarkRotationPush measures one rotation (a CSR signed by the
// in-process CA) until every FetchX509SVID stream, over 8 connections, has
// received the new SVID: with 1,000 streams, and with none for the cost of
// the rotation itself.
//
//	go test -run '^$' -bench RotationPush -benchmem -benchtime 200x ./sds/workloadendpoint
func BenchmarkRotationPush(b *testing.B) {
	for _, n := range []int{0, 1000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) { benchRotationPush(b, n) })
	}
}

func benchRotationPush(b *testing.B, streams int) {
	const conns = 8
	a := newAgent(b, nil, nil, "app", nil)
	ctx := withHeader(guardCtx(b))
	clients := make([]workloadpb.SpiffeWorkloadAPIClient, conns)
	for i := range clients {
		clients[i] = raw(b, a.path)
	}
	got := make(chan struct{}, streams)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, streams)
	defer func() {
		cancel()
		for range streams {
			<-done
		}
	}()
	for i := range streams {
		s, err := clients[i%conns].FetchX509SVID(sctx, &workloadpb.X509SVIDRequest{})
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
				got <- struct{}{}
			}
		}()
	}
	wait := func() {
		for range streams {
			select {
			case <-got:
			case <-ctx.Done():
				b.Fatal("streams not all served")
			}
		}
	}
	wait() // the first SVID
	b.ResetTimer()
	for b.Loop() {
		if err := a.m.Rotate(ctx); err != nil {
			b.Fatal(err)
		}
		wait()
	}
}
