package workloadapi

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MetadataKey is the request metadata every call must carry with the value
// "true": the SPIFFE Workload Endpoint specification requires it, so that a
// server-side request forgery (a proxy made to call the socket) is refused.
const MetadataKey = "workload.spiffe.io"

// Refusal reasons, the reason label of meshid_workloadapi_refused_total.
const (
	reasonMetadata    = "metadata"
	reasonStreams     = "streams"
	reasonConnections = "connections"
)

// checkMetadata returns InvalidArgument unless ctx carries MetadataKey
// with exactly one value, "true".
func (s *Server) checkMetadata(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(MetadataKey); len(v) == 1 && v[0] == "true" {
		return nil
	}
	s.metrics.refused.WithLabelValues(reasonMetadata).Inc()
	return status.Errorf(codes.InvalidArgument, "security header missing from request: %s: true is required", MetadataKey)
}

func (s *Server) unaryGate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.checkMetadata(ctx); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// streamGate checks the metadata, then takes one of the MaxStreams tokens
// for the stream's life: one stream more is refused with ResourceExhausted
// rather than queued, so a client cannot hold the agent's memory.
func (s *Server) streamGate(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.checkMetadata(ss.Context()); err != nil {
		return err
	}
	select {
	case s.streams <- struct{}{}:
	default:
		s.metrics.refused.WithLabelValues(reasonStreams).Inc()
		return status.Errorf(codes.ResourceExhausted, "too many Workload API streams open (%d)", cap(s.streams))
	}
	s.metrics.streams.Inc()
	defer func() {
		<-s.streams
		s.metrics.streams.Dec()
	}()
	return h(srv, ss)
}
