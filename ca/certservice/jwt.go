package certservice

import (
	"context"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/peer"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/internal/logs"
)

// JWTIssuer mints JWT-SVIDs and publishes the JWKS that verifies them;
// *jwtissuer.Issuer implements it. CheckAudience (and IssueFor) refuse bad
// audiences with InvalidArgument.
type JWTIssuer interface {
	CheckAudience(audience []string) error
	IssueFor(id spiffeid.ID, audience []string, cred ca.Credential) (*jwtissuer.Token, error)
	JWKS() ([]byte, error)
}

// jwtService serves meshid.v1.JWTSVIDService (internal/jwtapi) with the
// Server's authentication.
type jwtService struct {
	s      *Server
	issuer JWTIssuer
}

// MintJWTSVID authenticates the caller exactly as CreateCertificate does
// (the same chain, rate limit and error codes) and returns a JWT-SVID whose
// subject is the identity it proved, expiring no later than the caller's
// token or client certificate (Unauthenticated when that has expired). A request naming another identity in
// spiffe_id is refused with PermissionDenied; impersonation is not offered
// for JWT-SVIDs.
func (j jwtService) MintJWTSVID(ctx context.Context, req *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error) {
	resp, err := j.mint(ctx, req)
	if err != nil {
		attrs := []any{"code", Code(err).String(), "error", err}
		if p, ok := peer.FromContext(ctx); ok {
			attrs = append(attrs, "peer", p.Addr.String())
		}
		j.s.log.Info("JWT-SVID request refused", attrs...)
		return nil, toStatus(err)
	}
	return resp, nil
}

func (j jwtService) mint(ctx context.Context, req *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error) {
	if len(req.GetSpiffeId()) > MaxImpersonatedIdentity {
		return nil, ca.Errorf(ca.KindInvalidArgument, "spiffe_id is %d bytes, more than the %d-byte limit", len(req.GetSpiffeId()), MaxImpersonatedIdentity)
	}
	// The request is checked before the caller, as CreateCertificate
	// checks its TTL: bad input costs no token review.
	if err := j.issuer.CheckAudience(req.GetAudience()); err != nil {
		return nil, err
	}
	cluster, err := clusterIDHeader(ctx)
	if err != nil {
		return nil, err
	}
	caller, id, err := j.s.authenticate(ctx, cluster)
	if err != nil {
		return nil, err
	}
	if want := req.GetSpiffeId(); want != "" && want != id.String() {
		return nil, ca.Errorf(ca.KindPermissionDenied, "%s may only have a JWT-SVID for %s, not %q", caller, id, clipInput(want))
	}
	// A JWT-SVID never outlives the credential that proved its caller:
	// the client certificate, or the token, whatever CapTTLToToken says
	// for X.509 leaves (that default is Istio's, for certificates its
	// agent renews; a bearer token minted on a bearer token must not
	// stretch it).
	tok, err := j.issuer.IssueFor(id, req.GetAudience(), ca.Credential{Certificate: caller.Certificate, TokenExpiry: caller.Expiry})
	if err != nil {
		return nil, err
	}
	j.s.log.Debug("JWT-SVID issued", logs.KeySPIFFEID, id.String(), logs.KeyCaller, caller.String(), logs.KeyKid, tok.KeyID, logs.KeyExpiry, tok.Expiry.UTC())
	return &workloadpb.JWTSVIDResponse{Svids: []*workloadpb.JWTSVID{{SpiffeId: id.String(), Svid: tok.Token}}}, nil
}

// FetchJWTBundles returns the JWKS, keyed by the trust domain's SPIFFE ID.
// It needs no credentials: the bundle holds public keys only, and every
// validator (not only callers with a token) needs it.
func (j jwtService) FetchJWTBundles(context.Context, *workloadpb.JWTBundlesRequest) (*workloadpb.JWTBundlesResponse, error) {
	jwks, err := j.issuer.JWKS()
	if err != nil { // Unavailable until a replica has loaded the shared keys
		return nil, toStatus(err)
	}
	bundles := j.s.federatedJWKS() // a fresh map: the federated trust domains' keys
	bundles[j.s.authority.TrustDomain().IDString()] = jwks
	return &workloadpb.JWTBundlesResponse{Bundles: bundles}, nil
}

var _ jwtapi.Server = jwtService{}
