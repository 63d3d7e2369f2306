package authn

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/meshid/meshid/ca"
)

// NewChain returns an Authenticator that tries auths in order; the first
// that accepts wins. An authenticator that returns ErrNoCredentials is
// skipped. An authenticator whose error is a final verdict on the token
// (FinalForToken: TokenReview's answer for a token it owns) ends the token's
// turn: the authenticators after it are tried without the token, so an
// offline check cannot accept a token the API server refused or could not
// judge; a client certificate is still tried. When none accepts, the result is a ca.KindUnavailable error if
// any of them could not decide (an API server was down), else a
// ca.KindUnauthenticated error whose message joins the (token-free) reasons
// the authenticators gave.
func NewChain(auths ...Authenticator) Authenticator {
	c := make(chain, 0, len(auths))
	for _, a := range auths {
		if a != nil {
			c = append(c, a)
		}
	}
	return c
}

type chain []Authenticator

func (c chain) Authenticate(ctx context.Context, creds Credentials) (*Caller, error) {
	var (
		reasons     []string
		unavailable error
		cause       error
	)
	for _, a := range c {
		caller, err := a.Authenticate(ctx, creds)
		if err == nil {
			return caller, nil
		}
		if errors.Is(err, ErrNoCredentials) {
			continue
		}
		if v := (*tokenVerdict)(nil); errors.As(err, &v) {
			creds.Token = ""
		}
		var e *ca.Error
		if errors.As(err, &e) {
			reasons = append(reasons, e.Msg)
			if e.Kind == ca.KindUnavailable && unavailable == nil {
				unavailable = err
			}
		} else {
			// Not a classified error: the authenticator failed in a way
			// it did not expect. Its text may carry anything, so it goes
			// only into the cause (for logs), never into the message.
			reasons = append(reasons, "authenticator failed")
		}
		if cause == nil {
			cause = err
		}
	}
	if unavailable != nil {
		return nil, unavailable
	}
	if len(reasons) == 0 {
		return nil, ca.Errorf(ca.KindUnauthenticated, "authn: no credentials: send an \"authorization: Bearer <token>\" header or a client certificate")
	}
	return nil, ca.Wrap(ca.KindUnauthenticated, cause, "authn: "+strings.Join(dedupe(reasons), "; "))
}

func dedupe(s []string) []string {
	out := make([]string, 0, len(s))
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// tokenVerdict marks an error as the final answer about the request's token.
type tokenVerdict struct{ err error }

func (v *tokenVerdict) Error() string { return v.err.Error() }
func (v *tokenVerdict) Unwrap() error { return v.err }

// FinalForToken marks err as the final verdict on the request's token: in
// a chain, no later authenticator is given the token. err keeps its Kind.
func FinalForToken(err error) error {
	if err == nil {
		return nil
	}
	return &tokenVerdict{err: err}
}
