package sdsserver_test

import (
	"context"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

// Issue 28, hole 3: the SDS socket has the limits of every agent socket
// (internal/unixsock). One stream more than MaxStreams is refused with
// ResourceExhausted and counted, and a slot comes back when a stream ends;
// one connection more than MaxConnections is closed at once; a request
// above MaxRequestSize is refused; a call with headers above 16 KiB is not
// sent by a gRPC client, which learns the server's limit.
func TestSocketLimits(t *testing.T) {
	e := managerEnv(t)
	h := start(t, e.src, func(c *sdsserver.Config) { c.MaxStreams, c.MaxConnections = 2, 3 })
	first := h.withDefault(t)
	h.withDefault(t)
	c := newSotw(t, h.client, nil)
	if _, err := c.s.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too many SDS streams in progress (the limit is 2)") {
		t.Fatalf("a third stream: %v, want ResourceExhausted naming the limit", err)
	}
	h.wantMetric(t, 1, "meshid_agent_sds_refused_total", "reason", "streams")
	first.s.CloseSend()
	testkit.Until(t, "the first stream's end", func() bool { return h.metric(t, "meshid_agent_sds_streams") == 1 })
	testkit.Until(t, "a stream slot", func() bool {
		c := newSotw(t, h.client, nil)
		c.request(dflt)
		_, err := c.s.Recv()
		return err == nil
	})

	// Connections: h's client holds one; two more are served, the next
	// ones closed at once.
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	fetch := func(conn *grpc.ClientConn, ctx context.Context, opts ...grpc.CallOption) error {
		_, err := secretv3.NewSecretDiscoveryServiceClient(conn).FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: []string{dflt}}, opts...)
		return err
	}
	for i := range 2 {
		if err := fetch(dial(t, h.path), ctx); err != nil {
			t.Fatalf("connection %d: %v", i+2, err)
		}
	}
	if err := fetch(dial(t, h.path), ctx, grpc.WaitForReady(false)); status.Code(err) != codes.Unavailable {
		t.Fatalf("a connection beyond the cap: %v, want Unavailable", err)
	}
	if n := h.metric(t, "meshid_agent_sds_refused_total", "reason", "connections"); n < 1 {
		t.Fatalf("refused_total{connections} = %v", n)
	}
	h.logs.WaitFor(t, "SDS connections refused: too many open", 1)

	// A request above MaxRequestSize, on h's connection.
	big := &discoveryv3.DiscoveryRequest{ResourceNames: []string{dflt}, VersionInfo: strings.Repeat("v", sdsserver.MaxRequestSize)}
	if _, err := h.client.FetchSecrets(ctx, big); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request above %d bytes: %v, want ResourceExhausted", sdsserver.MaxRequestSize, err)
	}
	// Headers above the limit.
	hdr := metadata.AppendToOutgoingContext(ctx, "x-pad", strings.Repeat("a", sdsserver.MaxHeaderListSize))
	if _, err := h.client.FetchSecrets(hdr, &discoveryv3.DiscoveryRequest{ResourceNames: []string{dflt}}); err == nil {
		t.Fatal("a call with headers above the limit was served")
	}
}

// The socket's limits are Config fields with defaults; negative ones are
// refused.
func TestSocketLimitsConfig(t *testing.T) {
	if sdsserver.DefaultMaxStreams < 10000 || sdsserver.DefaultMaxConnections < 100 {
		t.Fatalf("the defaults (%d streams, %d connections) do not hold the 10,000 streams of target 3 over 100 connections",
			sdsserver.DefaultMaxStreams, sdsserver.DefaultMaxConnections)
	}
	for name, mod := range map[string]func(*sdsserver.Config){
		"MaxStreams":     func(c *sdsserver.Config) { c.MaxStreams = -1 },
		"MaxCalls":       func(c *sdsserver.Config) { c.MaxCalls = -1 },
		"MaxConnections": func(c *sdsserver.Config) { c.MaxConnections = -1 },
	} {
		cfg := sdsserver.Config{Source: newFakeSource(), SocketPath: "/tmp/x.sock"}
		mod(&cfg)
		if _, err := sdsserver.New(cfg); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("negative %s: %v", name, err)
		}
	}
}
