package sdsserver

import (
	"context"
	"strconv"
	"strings"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshid/meshid/internal/logs"
)

// FetchSecrets returns the requested secrets now, waiting (within the
// request's deadline) for one being generated. An unknown name is NotFound,
// one that cannot be produced now Unavailable.
func (s *Server) FetchSecrets(ctx context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	if t := req.GetTypeUrl(); t != "" && t != SecretTypeURL {
		s.metrics.bad.WithLabelValues(reasonTypeURL).Inc()
		return nil, errWrongType(t)
	}
	if n := len(req.GetResourceNames()); n > s.maxNames {
		s.metrics.bad.WithLabelValues(reasonTooManyNames).Inc()
		err := s.tooManyNames(n)
		s.fetchWarn("SDS request refused", "error", err)
		return nil, err
	}
	names := uniq(req.GetResourceNames())
	if len(names) == 0 {
		s.metrics.bad.WithLabelValues(reasonNoNames).Inc()
		return nil, errNoNames()
	}
	spiffe := wantsSPIFFE(req.GetNode())
	now := s.clock.Now()
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: SecretTypeURL, Resources: make([]*anypb.Any, 0, len(names))}
	versions := make([]string, 0, len(names))
	for _, name := range names {
		sec, err := s.src.Secret(ctx, name)
		if err != nil {
			return nil, s.fetchError(name, err)
		}
		e, err := s.hub.entry(sec)
		if err != nil {
			s.log.Error("cannot build SDS resource", logs.KeyResource, name, logs.KeyError, err)
			return nil, status.Errorf(codes.Internal, "sds: cannot encode %q", name)
		}
		if e.expired(now) {
			return nil, status.Errorf(codes.Unavailable, "sds: %q has expired and no new certificate is available yet", name)
		}
		resp.Resources = append(resp.Resources, e.resource(spiffe))
		versions = append(versions, e.version)
	}
	resp.VersionInfo = strings.Join(versions, ",")
	resp.Nonce = strconv.FormatUint(s.fetches.Add(1), 10)
	return resp, nil
}
