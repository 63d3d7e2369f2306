package unixsock

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// The limits every gRPC server on an agent socket has, whatever it serves:
// both sockets (SDS, Workload API) build their server with NewGRPC, so that
// their limits cannot drift apart (issue 28: the SDS socket had none).
const (
	// MaxHeaderListSize bounds a request's headers (gRPC's default is
	// 16 MiB): an SDS or Workload API call needs a few short headers.
	MaxHeaderListSize = 16 << 10
	// MaxConcurrentStreams bounds the streams of one connection (HTTP/2
	// SETTINGS_MAX_CONCURRENT_STREAMS); Limits.MaxStreams bounds those of
	// the whole socket.
	MaxConcurrentStreams = 1024
	// keepaliveMinTime: clients may ping a quiet stream this often.
	keepaliveMinTime = 10 * time.Second
)

// Refusal reasons, passed to GRPCConfig.Refused and ServerConfig.Refused.
const (
	ReasonStreams     = "streams"
	ReasonCalls       = "calls"
	ReasonConnections = "connections"
)

// Limits bounds what the clients of a socket may hold at once. Owners
// validate and default them (each has Default… constants on its Config).
type Limits struct {
	// MaxRequestSize bounds a request message, in bytes; above it the call
	// fails with ResourceExhausted.
	MaxRequestSize int
	// MaxStreams caps the streams open at once over the socket; one more
	// is refused with ResourceExhausted rather than queued.
	MaxStreams int
	// MaxCalls caps the unary calls in progress at once over the socket;
	// one more is refused with ResourceExhausted.
	MaxCalls int
}

// GRPCConfig configures NewGRPC.
type GRPCConfig struct {
	Label  string // "SDS", "Workload API": in refusal messages
	Limits Limits
	// Check, when set, runs first on every call and stream; its error
	// refuses the call before it takes a slot (the Workload API's
	// security header).
	Check func(ctx context.Context) error
	// Refused, when set, is called with ReasonStreams or ReasonCalls for
	// each call refused by a limit (a metric). It must not block.
	Refused func(reason string)
	// StreamOpened, when set, is called with +1 when a stream takes a
	// slot and -1 when it gives it back (a gauge).
	StreamOpened func(delta int)
}

// NewGRPC returns the gRPC server of an agent socket, with the limits above
// and cfg's: request size, header list size, streams per connection, a
// cap on the streams and on the unary calls of the whole socket, and a
// keepalive policy that lets clients ping quiet streams. Its Stop waits for
// the handlers (grpc.WaitForHandlers), so that Run leaves nothing behind.
// ServerConfig.MaxConnections caps the connections.
func NewGRPC(cfg GRPCConfig) *grpc.Server {
	g := &gate{cfg: cfg, streams: make(chan struct{}, cfg.Limits.MaxStreams), calls: make(chan struct{}, cfg.Limits.MaxCalls)}
	return grpc.NewServer(
		grpc.WaitForHandlers(true),
		grpc.MaxRecvMsgSize(cfg.Limits.MaxRequestSize),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.UnaryInterceptor(g.unary),
		grpc.StreamInterceptor(g.stream),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
	)
}

// gate holds a token per stream open and per unary call in progress.
type gate struct {
	cfg     GRPCConfig
	streams chan struct{}
	calls   chan struct{}
}

func (g *gate) take(ctx context.Context, slots chan struct{}, reason, what string) error {
	if g.cfg.Check != nil {
		if err := g.cfg.Check(ctx); err != nil {
			return err
		}
	}
	select {
	case slots <- struct{}{}:
		return nil
	default:
	}
	if g.cfg.Refused != nil {
		g.cfg.Refused(reason)
	}
	return status.Errorf(codes.ResourceExhausted, "too many %s %s in progress (the limit is %d); retry later", g.cfg.Label, what, cap(slots))
}

func (g *gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := g.take(ctx, g.calls, ReasonCalls, "calls"); err != nil {
		return nil, err
	}
	defer func() { <-g.calls }()
	return h(ctx, req)
}

func (g *gate) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := g.take(ss.Context(), g.streams, ReasonStreams, "streams"); err != nil {
		return err
	}
	if g.cfg.StreamOpened != nil {
		g.cfg.StreamOpened(1)
		defer g.cfg.StreamOpened(-1)
	}
	defer func() { <-g.streams }()
	return h(srv, ss)
}
