package ca

import (
	"crypto/x509"
	"time"
)

// Credential is what a caller proved its identity with, as far as it
// bounds what the CA issues to it.
type Credential struct {
	// Certificate is the client certificate of a renewal (authn.Caller's
	// Certificate); nil when the caller sent a token.
	Certificate *x509.Certificate
	// TokenExpiry is when the caller's token expires (authn.Caller's
	// Expiry); zero if unknown, or when the token is not to bound it.
	TokenExpiry time.Time
}

// Cap is the one rule that keeps an issued credential (an X.509 leaf, a
// JWT-SVID) from outliving the credential that proved its caller: it
// returns notAfter cut at the presented certificate's NotAfter, else at
// the token's expiry. A credential already expired at now is
// Unauthenticated, naming when it expired; so is one whose limit leaves
// nothing after rounding down to a whole second (a JWT-SVID's exp), as
// nothing valid could be issued on it.
func (c Credential) Cap(now, notAfter time.Time) (time.Time, error) {
	limit, what := c.TokenExpiry, "token"
	if c.Certificate != nil {
		limit, what = c.Certificate.NotAfter, "presented client certificate"
	}
	switch {
	case limit.IsZero():
		return notAfter, nil
	case !limit.Truncate(time.Second).After(now):
		return time.Time{}, reject(reasonCredential, KindUnauthenticated, "the %s expired at %s", what, limit.UTC().Format(time.RFC3339))
	case notAfter.After(limit):
		return limit, nil
	}
	return notAfter, nil
}
