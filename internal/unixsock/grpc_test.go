package unixsock_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/meshid/meshid/internal/unixsock"
	"github.com/meshid/meshid/testkit"
)

// blocked counts the calls of block in progress.
var blocked atomic.Int64

// block is a unary method that waits for its caller to leave.
var block = grpc.ServiceDesc{
	ServiceName: "test.Block",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(_ any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := &emptypb.Empty{}
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) {
				blocked.Add(1)
				defer blocked.Add(-1)
				<-ctx.Done()
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return in(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/test.Block/Call"}, h)
		},
	}},
}

// serve runs NewGRPC(cfg) with a health service (Watch: an endless
// stream) and the blocking method on a socket.
func serve(t *testing.T, cfg unixsock.GRPCConfig, maxConns int) *grpc.ClientConn {
	t.Helper()
	g := unixsock.NewGRPC(cfg)
	healthpb.RegisterHealthServer(g, health.NewServer())
	g.RegisterService(&block, nil)
	path := filepath.Join(testkit.ShortDir(t), "g.sock")
	srv := unixsock.NewServer(unixsock.ServerConfig{
		Name: "test", Label: "Test", Path: path, Mode: 0o600, Serve: g,
		MaxConnections: maxConns, ShutdownTimeout: 5 * time.Second,
	})
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "server", srv.Run)
	return testkit.DialUnix(t, path)
}

// The gate of every agent socket: streams and unary calls have their own
// caps over the socket; one more of either is refused with
// ResourceExhausted naming the socket and the limit, and counted; a slot
// comes back when its call ends. Full calls do not refuse streams.
func TestGRPCLimits(t *testing.T) {
	var refusedStreams, refusedCalls, open atomic.Int64
	conn := serve(t, unixsock.GRPCConfig{
		Label:  "Test",
		Limits: unixsock.Limits{MaxRequestSize: 1 << 10, MaxStreams: 2, MaxCalls: 2},
		Refused: func(reason string) {
			switch reason {
			case unixsock.ReasonStreams:
				refusedStreams.Add(1)
			case unixsock.ReasonCalls:
				refusedCalls.Add(1)
			}
		},
		StreamOpened: func(d int) { open.Add(int64(d)) },
	}, 8)
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	watch := func(ctx context.Context) error {
		s, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}
	sctx, endStreams := context.WithCancel(ctx)
	for range 2 {
		if err := watch(sctx); err != nil {
			t.Fatal(err)
		}
	}
	err := watch(ctx)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too many Test streams in progress (the limit is 2)") {
		t.Fatalf("a third stream: %v", err)
	}
	// Calls: two wait, the third is refused; streams do not count.
	call := func(ctx context.Context) error {
		return conn.Invoke(ctx, "/test.Block/Call", &emptypb.Empty{}, &emptypb.Empty{})
	}
	cctx, endCalls := context.WithCancel(ctx)
	results := make(chan error, 2)
	for range 2 {
		go func() { results <- call(cctx) }()
	}
	until(t, func() bool { return blocked.Load() == 2 })
	err = call(ctx)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too many Test calls in progress (the limit is 2)") {
		t.Fatalf("a third call: %v", err)
	}
	if refusedStreams.Load() != 1 || refusedCalls.Load() != 1 || open.Load() != 2 {
		t.Fatalf("refused streams %d, calls %d; open streams %d", refusedStreams.Load(), refusedCalls.Load(), open.Load())
	}
	endCalls()
	for range 2 {
		if err := <-results; status.Code(err) != codes.Canceled {
			t.Fatalf("a call whose caller left: %v", err)
		}
	}
	endStreams()
	until(t, func() bool { return open.Load() == 0 })
	if err := watch(ctx); err != nil {
		t.Fatalf("a stream after the others ended: %v", err)
	}
	// A request above MaxRequestSize.
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("s", 2<<10)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 2 KiB request over a 1 KiB limit: %v", err)
	}
}

// Check runs before a call takes a slot: a refused call costs none.
func TestGRPCCheckFirst(t *testing.T) {
	conn := serve(t, unixsock.GRPCConfig{
		Label:  "Test",
		Limits: unixsock.Limits{MaxRequestSize: 1 << 10, MaxStreams: 1, MaxCalls: 1},
		Check: func(context.Context) error {
			return status.Error(codes.InvalidArgument, "no")
		},
	}, 8)
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	for range 5 {
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("checked call: %v", err)
		}
	}
}

// until spins until cond holds, failing after testkit.Guard; it never
// sleeps.
func until(t *testing.T, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("condition not met in time")
		default:
		}
	}
}
