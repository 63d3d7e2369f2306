package caserver

import (
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/authn/boundtoken"
)

// boundTokenVerifier returns the local verifier of the cluster's bound
// tokens, tried before TokenReview, or nil when TokenVerification is
// tokenreview or there is no client to build it from (then it says so in
// the log and in meshid_ca_token_verification_mode).
func (s *Server) boundTokenVerifier() (*boundtoken.Verifier, error) {
	cfg := s.cfg
	mode := cfg.TokenVerification
	if mode != boundtoken.ModeTokenReview && s.kc.metadata == nil {
		s.log.Warn("local token verification needs a client from --kubeconfig or the in-cluster config; every token goes to TokenReview", "configured", string(mode))
		mode = boundtoken.ModeTokenReview
	}
	if mode == boundtoken.ModeTokenReview {
		return nil, boundtoken.ReportTokenReview(cfg.Registerer, cfg.Logger)
	}
	return boundtoken.New(boundtoken.Config{
		REST:       s.kc.auth.CoreV1().RESTClient(),
		Metadata:   s.kc.metadata,
		Mode:       mode,
		Audiences:  cfg.TokenAudiences,
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
	})
}

// prepend puts v first, when there is one.
func prepend(v *boundtoken.Verifier, auths []authn.Authenticator) []authn.Authenticator {
	if v == nil {
		return auths
	}
	return append([]authn.Authenticator{v}, auths...)
}
