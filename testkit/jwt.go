package testkit

import (
	"context"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/jwtissuer"
)

// JWTSigner is a secretcache.JWTSigner that mints with an in-process
// jwtissuer.Issuer: the CA's JWT-SVID path without the gRPC hop. Like the
// CA, it mints for the identity asked for (the agent's CA client would
// prove it with a token); Mint, when set, is called first and may fail or
// replace the answer.
type JWTSigner struct {
	Issuer *jwtissuer.Issuer
	Mint   func(id spiffeid.ID, audience []string) (string, error)
}

func (s JWTSigner) MintJWTSVID(_ context.Context, id spiffeid.ID, audience []string) (string, error) {
	if s.Mint != nil {
		return s.Mint(id, audience)
	}
	tok, err := s.Issuer.Issue(id, audience)
	if err != nil {
		return "", err
	}
	return tok.Token, nil
}

func (s JWTSigner) FetchJWTBundles(context.Context) (map[string][]byte, error) {
	jwks, err := s.Issuer.JWKS()
	if err != nil {
		return nil, err
	}
	return map[string][]byte{s.Issuer.TrustDomain().IDString(): jwks}, nil
}
