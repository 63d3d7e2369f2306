package workloadendpoint

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MetadataKey is the request metadata every call must carry with the value
// "true": the SPIFFE Workload Endpoint specification requires it, so that a
// server-side request forgery (a proxy made to call the socket) is refused.
const MetadataKey = "workload.spiffe.io"

// Refusal reasons, the reason label of meshid_agent_workloadapi_refused_total.
const (
	reasonMetadata = "metadata"
	// and unixsock's: streams, calls, connections
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
