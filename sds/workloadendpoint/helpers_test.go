package workloadendpoint_test

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/workloadendpoint"
	"github.com/meshid/meshid/testkit"
)

const ttl = time.Hour

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// agent is one agent's SecretManager, signed by a real in-process CA, and
// the Workload API server on a real Unix socket.
type testAgent struct {
	clock *clock.Fake
	m     *secretcache.Manager
	srv   *workloadendpoint.Server
	reg   *prometheus.Registry
	path  string
	id    spiffeid.ID
}

// newAgent starts an agent for sa on authority (a new one when nil). The
// fake clock starts at the real time, so that the certificates it issues
// verify in real TLS handshakes.
func newAgent(t testing.TB, authority *ca.Authority, clk *clock.Fake, sa string, mod func(*workloadendpoint.Config)) *testAgent {
	t.Helper()
	if clk == nil {
		clk = clock.NewFake(time.Now().Truncate(time.Second))
	}
	if authority == nil {
		authority = testkit.NewAuthority(t, td, clk, nil)
	}
	id := spiffeid.RequireFromPath(td, "/ns/default/sa/"+sa)
	m, err := secretcache.New(secretcache.Config{
		Signer: testkit.AuthoritySigner{Authority: authority},
		ID:     id,
		TTL:    ttl,
		Jitter: -1,
		Clock:  clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := workloadendpoint.Config{
		Source:     m,
		SocketPath: filepath.Join(testkit.ShortDir(t), "workload.sock"),
		Registerer: reg,
		Clock:      clk,
	}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := workloadendpoint.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "agent", m.Run, srv.Run)
	return &testAgent{clock: clk, m: m, srv: srv, reg: reg, path: cfg.SocketPath, id: id}
}

// addr is the socket in go-spiffe's address form.
func (a *testAgent) addr() workloadapi.ClientOption { return workloadapi.WithAddr("unix://" + a.path) }

// rotate moves the fake clock to the Manager's renewal time, once its
// scheduler is parked on it: the renewal then pushes the new certificate.
func (a *testAgent) rotate(t testing.TB) {
	t.Helper()
	a.clock.Set(testkit.NextDeadline(t, a.clock, "the Manager's renewal timer"))
}

// raw dials the socket with a plain gRPC client.
func raw(t testing.TB, path string) workloadpb.SpiffeWorkloadAPIClient {
	t.Helper()
	return workloadpb.NewSpiffeWorkloadAPIClient(testkit.DialUnix(t, path))
}

// firstResponse opens FetchX509SVID (i even) or FetchX509Bundles (i odd)
// and reads its first response.
func firstResponse(ctx context.Context, c workloadpb.SpiffeWorkloadAPIClient, i int) (err error) {
	if i%2 == 0 {
		_, err = recvFirst(c.FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{}))
	} else {
		_, err = recvFirst(c.FetchX509Bundles(ctx, &workloadpb.X509BundlesRequest{}))
	}
	return err
}

// recvFirst reads the first response of the stream just opened, or returns the
// error of opening it: recvFirst(c.FetchX509SVID(ctx, req)).
func recvFirst[R any](s grpc.ServerStreamingClient[R], err error) (*R, error) {
	if err != nil {
		return nil, err
	}
	return s.Recv()
}

// withHeader adds the required metadata.
func withHeader(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, workloadendpoint.MetadataKey, "true")
}

func guardCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	t.Cleanup(cancel)
	return ctx
}

func runtimeGosched() { runtime.Gosched() }
