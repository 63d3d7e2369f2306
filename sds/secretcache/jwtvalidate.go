package secretcache

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// jwtAlgorithms are the signature algorithms a JWT-SVID may use: those of
// the SPIFFE JWT-SVID specification, as go-spiffe's jwtsvid accepts them.
var jwtAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.PS256, jose.PS384, jose.PS512,
}

// errUnknownKey is a token signed by a key the bundle does not hold (yet).
var errUnknownKey = fmt.Errorf("%w: signed by a key the JWT bundle does not hold", ErrInvalidJWT)

// validateJWT checks token as go-spiffe's jwtsvid.ParseAndValidate does
// (algorithm, typ header, key ID found in the bundle of the subject's trust
// domain, signature, subject a SPIFFE ID, exp present, audience, expiry
// with go-jose's one-minute leeway), but at now from the injected clock:
// ParseAndValidate reads time.Now, so the agent could not be tested on a
// fake clock with it. The interoperability test checks both agree.
func validateJWT(token string, set *jwtbundle.Set, audience []string, now time.Time) (*JWTSVID, error) {
	if len(token) > MaxJWTSize {
		return nil, fmt.Errorf("%w: %d bytes, more than the limit of %d", ErrInvalidJWT, len(token), MaxJWTSize)
	}
	tok, err := jwt.ParseSigned(token, jwtAlgorithms)
	if err != nil {
		return nil, fmt.Errorf("%w: not a signed JWT", ErrInvalidJWT)
	}
	h := tok.Headers[0]
	if typ, ok := h.ExtraHeaders[jose.HeaderType]; ok && typ != "JWT" && typ != "JOSE" {
		return nil, fmt.Errorf("%w: header typ is neither JWT nor JOSE", ErrInvalidJWT)
	}
	var claims jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&claims); err != nil {
		return nil, fmt.Errorf("%w: unreadable claims", ErrInvalidJWT)
	}
	if claims.Subject == "" || claims.Expiry == nil {
		return nil, fmt.Errorf("%w: the sub and exp claims are required", ErrInvalidJWT)
	}
	id, err := spiffeid.FromString(claims.Subject)
	if err != nil {
		return nil, fmt.Errorf("%w: sub is not a SPIFFE ID", ErrInvalidJWT)
	}
	if h.KeyID == "" {
		return nil, fmt.Errorf("%w: the header has no key ID", ErrInvalidJWT)
	}
	b, ok := set.Get(id.TrustDomain())
	if !ok {
		return nil, fmt.Errorf("%w: no JWT bundle for trust domain %s", ErrInvalidJWT, id.TrustDomain().Name())
	}
	key, ok := b.FindJWTAuthority(h.KeyID)
	if !ok {
		return nil, errUnknownKey
	}
	all := map[string]any{}
	if err := tok.Claims(key, &all); err != nil {
		return nil, fmt.Errorf("%w: bad signature", ErrInvalidJWT)
	}
	if err := claims.Validate(jwt.Expected{AnyAudience: audience, Time: now}); err != nil {
		switch {
		case errors.Is(err, jwt.ErrExpired):
			err = errors.New("expired")
		case errors.Is(err, jwt.ErrInvalidAudience):
			err = fmt.Errorf("audience %q is not one of %q", claims.Audience, audience)
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalidJWT, err)
	}
	return &JWTSVID{Token: token, ID: id, Audience: claims.Audience, Expiry: claims.Expiry.Time(), Claims: all}, nil
}
