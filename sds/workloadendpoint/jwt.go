package workloadendpoint

import (
	"context"
	"errors"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/sds/secretcache"
)

// JWTSource provides JWT-SVIDs and the JWT bundle; *secretcache.Manager
// implements it. A Source that is not a JWTSource makes the JWT methods
// answer Unimplemented.
type JWTSource interface {
	ID() spiffeid.ID
	JWTSVID(ctx context.Context, audience []string) (*secretcache.JWTSVID, error)
	JWTBundle(ctx context.Context) (*secretcache.JWTBundle, error)
	WatchJWTBundle(notify func(*secretcache.JWTBundle)) (cancel func())
	ValidateJWTSVID(ctx context.Context, token, audience string) (*secretcache.JWTSVID, error)
}

// FetchJWTSVID returns the workload's JWT-SVID for the request's audiences
// (required): from the agent's cache while it has half its life left. A
// request naming another SPIFFE ID is refused with PermissionDenied: the
// agent holds one identity.
func (s *Server) FetchJWTSVID(ctx context.Context, req *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error) {
	src, err := s.jwtSource()
	if err != nil {
		return nil, err
	}
	if want := req.GetSpiffeId(); want != "" && want != src.ID().String() {
		return nil, status.Errorf(codes.PermissionDenied, "this agent serves only %s", src.ID())
	}
	svid, err := src.JWTSVID(ctx, req.GetAudience())
	if err != nil {
		return nil, s.jwtStatus(ctx, err)
	}
	s.metrics.pushes.WithLabelValues("FetchJWTSVID").Inc()
	return &workloadpb.JWTSVIDResponse{Svids: []*workloadpb.JWTSVID{{SpiffeId: svid.ID.String(), Svid: svid.Token}}}, nil
}

// FetchJWTBundles streams the JWT bundles (JWKS by trust domain): once,
// then again on every change the agent's refresh sees.
func (s *Server) FetchJWTBundles(_ *workloadpb.JWTBundlesRequest, stream grpc.ServerStreamingServer[workloadpb.JWTBundlesResponse]) error {
	src, err := s.jwtSource()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	changed := make(chan struct{}, 1)
	defer src.WatchJWTBundle(func(*secretcache.JWTBundle) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})()
	var last string
	for {
		b, err := src.JWTBundle(ctx)
		if err != nil {
			return s.jwtStatus(ctx, err)
		}
		if b.Version != last {
			if err := stream.Send(&workloadpb.JWTBundlesResponse{Bundles: b.Raw}); err != nil {
				return err
			}
			s.metrics.pushes.WithLabelValues("FetchJWTBundles").Inc()
			last = b.Version
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// ValidateJWTSVID validates a JWT-SVID for one audience against the JWT
// bundle; any refusal is InvalidArgument.
func (s *Server) ValidateJWTSVID(ctx context.Context, req *workloadpb.ValidateJWTSVIDRequest) (*workloadpb.ValidateJWTSVIDResponse, error) {
	src, err := s.jwtSource()
	if err != nil {
		return nil, err
	}
	switch {
	case req.GetAudience() == "":
		return nil, status.Error(codes.InvalidArgument, "audience must be specified")
	case req.GetSvid() == "":
		return nil, status.Error(codes.InvalidArgument, "svid must be specified")
	}
	svid, err := src.ValidateJWTSVID(ctx, req.GetSvid(), req.GetAudience())
	if err != nil {
		return nil, s.jwtStatus(ctx, err)
	}
	claims, err := structpb.NewStruct(svid.Claims)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "the token's claims are not JSON values")
	}
	return &workloadpb.ValidateJWTSVIDResponse{SpiffeId: svid.ID.String(), Claims: claims}, nil
}

func (s *Server) jwtSource() (JWTSource, error) {
	if src, ok := s.src.(JWTSource); ok {
		return src, nil
	}
	return nil, status.Error(codes.Unimplemented, "this agent serves no JWT-SVIDs")
}

// jwtStatus maps a JWT failure to its status: bad input InvalidArgument, too
// many requests in progress ResourceExhausted, a CA refusal its own code,
// anything not ready Unavailable. Token contents
// never reach the message: the errors name what failed, not the token.
func (s *Server) jwtStatus(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, secretcache.ErrInvalidAudience), errors.Is(err, secretcache.ErrInvalidJWT) && !errors.Is(err, secretcache.ErrNotReady):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, secretcache.ErrJWTUnavailable):
		return status.Error(codes.Unavailable, "this agent has no CA for JWT-SVIDs")
	case errors.Is(err, secretcache.ErrTooManyJWTRequests):
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown && st.Code() != codes.OK {
		return status.Error(st.Code(), "CA: "+st.Message())
	}
	s.jwtWarns.Warn(s.log, s.clock.Now(), "Workload API: JWT request failed", "error", err)
	return status.Error(codes.Unavailable, "JWT-SVIDs are not available now")
}
