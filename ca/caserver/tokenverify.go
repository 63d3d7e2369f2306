package caserver

import (
	"context"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/internal/logs"
)

// boundTokenVerifier returns the local verifier of the cluster's bound
// tokens, tried before TokenReview, or nil when TokenVerification is
// tokenreview or there is no client to build it from (then it says so in
// the log and in meshid_ca_token_verification_mode).
func (s *Server) boundTokenVerifier() (*boundtoken.Verifier, error) {
	cfg := s.cfg
	mode := cfg.Authn.TokenVerification
	if mode != boundtoken.ModeTokenReview && s.kc.metadata == nil {
		s.log.Warn("local token verification needs a client from --kubeconfig or the in-cluster config; every token goes to TokenReview", logs.KeyConfigured, string(mode))
		mode = boundtoken.ModeTokenReview
	}
	if mode == boundtoken.ModeTokenReview {
		return nil, boundtoken.ReportTokenReview(cfg.Registerer, cfg.Logger)
	}
	return boundtoken.New(boundtoken.Config{
		REST:       s.kc.auth.CoreV1().RESTClient(),
		Metadata:   s.kc.metadata,
		Mode:       mode,
		Audiences:  cfg.Authn.TokenAudiences,
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
	})
}

// prepend puts v first, when there is one. v only judges requests for the
// local cluster (no ClusterID, or local): a token sent for another cluster
// goes on to the cluster router, whose verdict for that cluster is final, so
// a local token presented as another cluster's is never accepted here.
func prepend(v *boundtoken.Verifier, local string, auths []authn.Authenticator) []authn.Authenticator {
	if v == nil {
		return auths
	}
	return append([]authn.Authenticator{localOnly{v, local}}, auths...)
}

// localOnly is the local verifier limited to the local cluster's requests.
type localOnly struct {
	v     *boundtoken.Verifier
	local string
}

func (l localOnly) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	if creds.ClusterID != "" && creds.ClusterID != l.local {
		return nil, authn.ErrNoCredentials
	}
	return l.v.Authenticate(ctx, creds)
}
