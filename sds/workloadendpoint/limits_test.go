package workloadendpoint_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/workloadendpoint"
	"github.com/meshid/meshid/testkit"
)

// A call without workload.spiffe.io: true (absent, another value, or
// repeated) is refused with InvalidArgument before anything is served: a
// request forged through a proxy carries no such header.
func TestMetadataRequired(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	c := raw(t, a.path)
	ctx := guardCtx(t)
	for name, md := range map[string]metadata.MD{
		"absent":   nil,
		"false":    metadata.Pairs(workloadendpoint.MetadataKey, "false"),
		"TRUE":     metadata.Pairs(workloadendpoint.MetadataKey, "TRUE"),
		"empty":    metadata.Pairs(workloadendpoint.MetadataKey, ""),
		"repeated": metadata.Pairs(workloadendpoint.MetadataKey, "true", workloadendpoint.MetadataKey, "false"),
		"other":    metadata.Pairs("workload.spiffe.io.x", "true"),
	} {
		cctx := metadata.NewOutgoingContext(ctx, md)
		_, err := recvFirst(c.FetchX509SVID(cctx, &workloadpb.X509SVIDRequest{}))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), workloadendpoint.MetadataKey) {
			t.Errorf("FetchX509SVID, header %s: %v, want InvalidArgument naming the header", name, err)
		}
		_, err = recvFirst(c.FetchX509Bundles(cctx, &workloadpb.X509BundlesRequest{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("FetchX509Bundles, header %s: %v, want InvalidArgument", name, err)
		}
		if _, err := c.ValidateJWTSVID(cctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "a", Svid: "x"}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ValidateJWTSVID, header %s: %v, want InvalidArgument", name, err)
		}
	}
	if n := testkit.Metric(t, a.reg, "meshid_agent_workloadapi_refused_total", "reason", "metadata"); n != 18 {
		t.Fatalf("refused_total{metadata} = %v, want 18", n)
	}
	if n := a.m.Watchers(secretcache.DefaultName); n != 0 {
		t.Fatalf("a refused call left %d watchers", n)
	}
	// With the header, the same client is served.
	s, err := c.FetchX509SVID(withHeader(ctx), &workloadpb.X509SVIDRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Recv(); err != nil || len(r.Svids) != 1 {
		t.Fatalf("with the header: %v", err)
	}
}

// One stream more than MaxStreams is refused with ResourceExhausted; when
// a stream ends, its slot is free again.
func TestStreamLimit(t *testing.T) {
	a := newAgent(t, nil, nil, "app", func(c *workloadendpoint.Config) { c.MaxStreams = 3 })
	c := raw(t, a.path)
	ctx := withHeader(guardCtx(t))
	cancels := make([]context.CancelFunc, 0, 3)
	for i := range 3 {
		sctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		if err := firstResponse(sctx, c, i); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	over := func() error { _, err := recvFirst(c.FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{})); return err }
	for range 100 {
		if err := over(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stream beyond the cap: %v, want ResourceExhausted", err)
		}
	}
	if n := testkit.Metric(t, a.reg, "meshid_agent_workloadapi_refused_total", "reason", "streams"); n != 100 {
		t.Fatalf("refused_total{streams} = %v, want 100", n)
	}
	if n := testkit.Metric(t, a.reg, "meshid_agent_workloadapi_streams"); n != 3 {
		t.Fatalf("streams gauge %v, want 3", n)
	}
	cancels[0]()
	// The slot comes back once the handler has seen the cancellation.
	waitFor(t, func() bool { return testkit.Metric(t, a.reg, "meshid_agent_workloadapi_streams") == 2 })
	if err := over(); err != nil {
		t.Fatalf("stream after one ended: %v", err)
	}
	for _, c := range cancels[1:] {
		c()
	}
}

// One connection more than MaxConnections is closed at once; the
// connections within the cap are served.
func TestConnectionLimit(t *testing.T) {
	logs := testkit.NewLogRecorder()
	a := newAgent(t, nil, nil, "app", func(c *workloadendpoint.Config) {
		c.MaxConnections = 2
		c.Logger = logs.Logger()
	})
	ctx := withHeader(guardCtx(t))
	for i := range 2 {
		_, err := recvFirst(raw(t, a.path).FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{}))
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	for range 5 {
		_, err := recvFirst(raw(t, a.path).FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{}, grpc.WaitForReady(false)))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("connection beyond the cap: %v, want Unavailable", err)
		}
	}
	if n := testkit.Metric(t, a.reg, "meshid_agent_workloadapi_refused_total", "reason", "connections"); n < 5 {
		t.Fatalf("refused_total{connections} = %v, want at least 5", n)
	}
	// The refusals warn once a minute, not once each.
	const warning = "Workload API connections refused"
	if n := logs.Count(warning); n != 1 {
		t.Fatalf("%d warnings for the refused connections, want 1:\n%s", n, logs.All())
	}
	a.clock.Add(time.Minute)
	_, err := recvFirst(raw(t, a.path).FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{}, grpc.WaitForReady(false)))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("connection beyond the cap: %v", err)
	}
	logs.WaitFor(t, warning, 2)
}

// A request above MaxRequestSize is refused with ResourceExhausted
// (unknown fields padding an otherwise empty request).
func TestHugeRequestRefused(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	req := &workloadpb.X509SVIDRequest{}
	pad := protowire.AppendTag(nil, 1000, protowire.BytesType)
	pad = protowire.AppendBytes(pad, make([]byte, workloadendpoint.MaxRequestSize))
	req.ProtoReflect().SetUnknown(pad)
	_, err := recvFirst(raw(t, a.path).FetchX509SVID(withHeader(guardCtx(t)), req))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("huge request: %v, want ResourceExhausted", err)
	}
}

// 1,000 streams opened, served and closed leave no goroutine, watcher or
// stream slot behind.
func TestStreamCyclesDoNotLeak(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	c := raw(t, a.path)
	ctx := withHeader(guardCtx(t))
	cycle := func(i int) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if err := firstResponse(sctx, c, i); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
	}
	cycle(0) // the connection and its goroutines exist from here on
	cycle(1)
	waitFor(t, func() bool { return testkit.Metric(t, a.reg, "meshid_agent_workloadapi_streams") == 0 })
	base := goleak.IgnoreCurrent()
	for i := range 1000 {
		cycle(i)
	}
	waitFor(t, func() bool { return testkit.Metric(t, a.reg, "meshid_agent_workloadapi_streams") == 0 })
	if err := goleak.Find(base); err != nil {
		t.Fatalf("goroutines left after 1,000 stream cycles: %v", err)
	}
	for _, n := range []string{secretcache.DefaultName, secretcache.RootName} {
		if w := a.m.Watchers(n); w != 0 {
			t.Fatalf("%d watchers of %s left", w, n)
		}
	}
	if n := testkit.Metric(t, a.reg, "meshid_agent_workloadapi_pushes_total", "method", "FetchX509SVID"); n != 501 {
		t.Fatalf("FetchX509SVID pushes %v, want 501", n)
	}
}

// waitFor polls cond until it holds, failing after testkit.Guard. It
// waits for a server goroutine to observe a client's cancellation, which
// nothing signals; it never sleeps.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	ctx := guardCtx(t)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("condition not met in time")
		default:
			runtimeGosched()
		}
	}
}

// Headers above MaxHeaderListSize are not served. The server advertises
// the limit, so a gRPC client fails the call itself (a raw HTTP/2 client
// that ignores it is refused by the server's transport, as
// ca/certservice/headers_test.go shows for the CA); without the limit, gRPC's
// 16 MiB default would serve the call below.
func TestHugeHeadersRefused(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	c := raw(t, a.path)
	ctx := withHeader(guardCtx(t))
	// A first call makes the client learn the server's settings.
	if s, err := c.FetchX509Bundles(ctx, &workloadpb.X509BundlesRequest{}); err != nil {
		t.Fatal(err)
	} else if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	big := metadata.AppendToOutgoingContext(ctx, "x-pad", strings.Repeat("a", 1<<20))
	_, err := recvFirst(c.FetchX509SVID(big, &workloadpb.X509SVIDRequest{}))
	if err == nil {
		t.Fatal("a call with 1 MiB of headers was served")
	}
	if n := testkit.Metric(t, a.reg, "meshid_agent_workloadapi_pushes_total", "method", "FetchX509SVID"); n != 0 {
		t.Fatalf("%v SVIDs sent to the call with huge headers", n)
	}
}

// blockingJWT is a Manager whose JWTSVID waits for its caller to leave, or
// answers err when set.
type blockingJWT struct {
	*secretcache.Manager
	inside atomic.Int64
	err    error
}

func (b *blockingJWT) JWTSVID(ctx context.Context, _ []string) (*secretcache.JWTSVID, error) {
	if b.err != nil {
		return nil, b.err
	}
	b.inside.Add(1)
	defer b.inside.Add(-1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// Issue 28, hole 1: unary calls (FetchJWTSVID, ValidateJWTSVID) are capped
// over the socket like streams: one call more than MaxCalls is refused
// with ResourceExhausted and counted; streams are served meanwhile (their
// own cap); a slot comes back when its caller leaves. Before, unary calls
// escaped every limit.
func TestCallLimit(t *testing.T) {
	var src *blockingJWT
	a := newAgent(t, nil, nil, "app", func(c *workloadendpoint.Config) {
		src = &blockingJWT{Manager: c.Source.(*secretcache.Manager)}
		c.Source = src
		c.MaxCalls = 3
	})
	c := raw(t, a.path)
	ctx := withHeader(guardCtx(t))
	cctx, leave := context.WithCancel(ctx)
	results := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := c.FetchJWTSVID(cctx, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}})
			results <- err
		}()
	}
	waitFor(t, func() bool { return src.inside.Load() == 3 })
	_, err := c.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too many Workload API calls") {
		t.Fatalf("a call beyond the cap: %v, want ResourceExhausted", err)
	}
	if n := testkit.Metric(t, a.reg, "meshid_agent_workloadapi_refused_total", "reason", "calls"); n != 1 {
		t.Fatalf("refused_total{calls} = %v, want 1", n)
	}
	if err := firstResponse(ctx, c, 0); err != nil {
		t.Fatalf("a stream while the calls are full: %v", err)
	}
	leave()
	for range 3 {
		if err := <-results; status.Code(err) != codes.Canceled {
			t.Fatalf("a call whose caller left: %v", err)
		}
	}
	src.err = fmt.Errorf("%w: 64 distinct audience sets are being requested", secretcache.ErrTooManyJWTRequests)
	waitFor(t, func() bool {
		_, err = c.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}})
		return status.Code(err) != codes.ResourceExhausted || strings.Contains(err.Error(), "audience sets")
	})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "64 distinct audience sets") {
		t.Fatalf("too many JWT-SVID requests: %v, want ResourceExhausted naming the bound", err)
	}
}
