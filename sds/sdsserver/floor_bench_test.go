package sdsserver_test

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// BenchmarkStreams10kFloor holds 10,000 SotW streams (100 connections of
// 100, the clients in a child process that ACKs like Envoy, see
// load_test.go) first on a bare SDS server and then on meshid's, in the
// same run, and reports for each the Go heap and stack per open stream,
// the time from starting the clients to every stream holding default, and
// for meshid's the time until its 10,000 handlers have cancelled their
// watches once the clients are killed at once (mass disconnect; run with
// -mutexprofile to see the contention).
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

		watches := &watchCounter{Source: m}
		h = start(b, watches, quiet)
		h.stop() // the harness's own client is not part of the load
		h = start(b, watches, quiet)
		mesh := holdStreams(b, h.path, streams, conns)
		allCancelled := watches.whenNoneOpen()
		t0 := time.Now()
		mesh.lc.close()
		select {
		case <-allCancelled:
		case <-time.After(time.Minute): // a safety bound, not a wait
			b.Fatalf("%d of %d streams still watching a minute after their clients died", watches.open.Load(), streams)
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

// watchCounter is the Source of meshid's server in the benchmark: it
// counts the watches open (one per stream holding default) and signals
// when the last is cancelled, which is when the last handler lets go of
// the secret cache on a mass disconnect.
type watchCounter struct {
	sdsserver.Source
	open atomic.Int64

	mu   sync.Mutex
	zero chan struct{} // closed when open next reaches 0
}

func (w *watchCounter) Watch(name string, notify func(*secretcache.Secret)) func() {
	w.open.Add(1)
	cancel := w.Source.Watch(name, notify)
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if w.open.Add(-1) == 0 {
				w.mu.Lock()
				if w.zero != nil {
					close(w.zero)
					w.zero = nil
				}
				w.mu.Unlock()
			}
		})
	}
}

// whenNoneOpen returns a channel closed when the open watches next fall
// to zero.
func (w *watchCounter) whenNoneOpen() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.zero = make(chan struct{})
	return w.zero
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
