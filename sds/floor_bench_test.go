package sds_test

import (
	"context"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"

	"github.com/meshid/meshid/internal/testkit"
)

// BenchmarkStreams10kFloor holds 10,000 SotW streams (100 connections of
// 100, the clients in a child process that ACKs like Envoy, see
// load_test.go) first on a bare SDS server and then on meshid's, in the
// same run, and reports for each the Go heap and stack per open stream,
// the time from starting the clients to every stream holding default, and
// for meshid's the time its 10,000 handlers take to end once the clients
// are killed at once (mass disconnect; run with -mutexprofile to see the
// contention).
//
// The bare server is the floor of an SDS server on gRPC: go-control-plane's
// generated SecretDiscoveryService with a handler that answers each new
// request with one prebuilt response (meshid's own, so the bytes are the
// same) and otherwise only blocks in Recv. meshid-B/stream over
// floor-B/stream is the overhead of meshid's per-stream state.
func BenchmarkStreams10kFloor(b *testing.B) {
	const streams, conns = 10000, 100
	m := newCAStack(b).m
	if _, err := m.Secret(context.Background(), dflt); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		h := start(b, m, quiet)
		c := newSotw(b, h.client, nil)
		c.request(dflt)
		resp := c.recv()
		h.stop()

		floorPath := filepath.Join(testkit.ShortDir(b), "floor.sock")
		stopFloor := serveBare(b, floorPath, resp)
		floor := holdStreams(b, floorPath, streams, conns)
		floor.lc.close()
		stopFloor()

		h = start(b, m, quiet)
		h.stop() // the harness's own client is not part of the load
		h = start(b, m, quiet)
		mesh := holdStreams(b, h.path, streams, conns)
		t0 := time.Now()
		mesh.lc.close()
		for runtime.NumGoroutine() > mesh.before.goroutines+8 && time.Since(t0) < time.Minute {
			time.Sleep(5 * time.Millisecond)
		}
		disconnect := time.Since(t0)
		h.stop()

		b.ReportMetric(floor.perStream, "floor-B/stream")
		b.ReportMetric(mesh.perStream, "meshid-B/stream")
		b.ReportMetric(100*mesh.perStream/floor.perStream, "%-of-floor")
		b.ReportMetric(floor.ready.Seconds()*1000, "floor-ready-ms")
		b.ReportMetric(mesh.ready.Seconds()*1000, "meshid-ready-ms")
		b.ReportMetric(disconnect.Seconds()*1000, "meshid-disconnect-ms")
	}
}

type held struct {
	lc        *loadClientProc
	before    memSample
	perStream float64       // heap and stack growth per open stream
	ready     time.Duration // from starting the clients to all holding default
}

func holdStreams(b *testing.B, path string, streams, conns int) held {
	before := memNow()
	t0 := time.Now()
	lc := startLoadClient(b, path, streams, conns)
	lc.wait("ready")
	ready := time.Since(t0)
	after := memNow()
	return held{lc: lc, before: before, ready: ready,
		perStream: float64(after.heap+after.stack-before.heap-before.stack) / float64(streams)}
}

// bareSDS is the floor: the generated service, one prebuilt response.
type bareSDS struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
	resp *discoveryv3.DiscoveryResponse
}

func (s *bareSDS) StreamSecrets(st secretv3.SecretDiscoveryService_StreamSecretsServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if req.GetResponseNonce() == "" {
			if err := st.Send(s.resp); err != nil {
				return err
			}
		}
	}
}

func serveBare(b *testing.B, path string, resp *discoveryv3.DiscoveryResponse) (stop func()) {
	l, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(g, &bareSDS{resp: resp})
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(l) }()
	return func() { g.Stop(); <-done }
}
