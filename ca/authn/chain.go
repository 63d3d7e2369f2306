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
// skipped. When none accepts, the result is a ca.KindUnavailable error if
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
