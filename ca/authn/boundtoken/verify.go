package boundtoken

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/identity"
)

// claims are a token's registered claims and its kubernetes.io claims, in
// the form the API server writes them (pkg/serviceaccount privateClaims),
// as go-jose decodes them.
type claims struct {
	jwt.Claims
	Kubernetes map[string]json.RawMessage `json:"kubernetes.io"`
}

type ref struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// kubeClaims are the kubernetes.io claims this package reads.
type kubeClaims struct {
	namespace         string
	serviceAccount    ref
	pod, secret, node *ref
}

// binding is what a verified token is bound to.
type binding struct {
	kubeClaims
	expiry time.Time
}

// knownBindingKeys are the kubernetes.io claims this package understands
// fully; a token with any other (a webhook-bound token, a future binding
// kind) is left to TokenReview. warnafter only changes the API server's
// metrics.
var knownBindingKeys = map[string]bool{"namespace": true, "serviceaccount": true, "pod": true, "secret": true, "node": true, "warnafter": true}

// verified is a cache entry: a token whose signature and claims were
// checked with keys; reused only while keys is still the key set in use.
type verified struct {
	keys *keySet
	b    *binding
}

// fallback means the token is left to TokenReview, for reason.
type fallback struct{ reason string }

func (f *fallback) Error() string { return "boundtoken: left to TokenReview: " + f.reason }

// Authenticate verifies creds.Token locally. It returns
// authn.ErrNoCredentials when there is no token or the token is left to
// TokenReview (see the package doc), a final (authn.FinalForToken)
// Unauthenticated error when it is not valid, and in ModeLocal before
// discovery and sync, a final Unavailable error.
func (v *Verifier) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	if creds.Token == "" {
		return nil, authn.ErrNoCredentials
	}
	if err := authn.CheckTokenSize(creds.Token, authn.MaxTokenSize); err != nil {
		return nil, err
	}
	if !v.Active() {
		if v.cfg.Mode == ModeAuto {
			v.results.WithLabelValues(fallbackInactive).Inc()
			return nil, authn.ErrNoCredentials
		}
		v.results.WithLabelValues(resultUnavailable).Inc()
		return nil, authn.FinalForToken(ca.Errorf(ca.KindUnavailable,
			"boundtoken: local token verification is not ready (issuer discovery or informers); see the CA's log"))
	}
	c, err := v.authenticate(ctx, creds.Token)
	var fb *fallback
	switch {
	case errors.As(err, &fb):
		v.results.WithLabelValues(fb.reason).Inc()
		return nil, authn.ErrNoCredentials
	case err != nil:
		v.results.WithLabelValues(resultRejected).Inc()
		return nil, authn.FinalForToken(err)
	}
	v.results.WithLabelValues(resultAccepted).Inc()
	return c, nil
}

func (v *Verifier) authenticate(ctx context.Context, token string) (*authn.Caller, error) {
	var key [32]byte
	ks := v.keys.Load()
	var b *binding
	if v.cache != nil {
		key = sha256.Sum256([]byte(token))
		if e, ok := v.cache.Get(key); ok && e.(*verified).keys == ks {
			b = e.(*verified).b
		}
	}
	if b == nil {
		var err error
		if b, ks, err = v.verify(ctx, token, ks); err != nil {
			return nil, err
		}
		if v.cache != nil {
			if ttl := min(v.cfg.CacheTTL, b.expiry.Sub(v.clock.Now())); ttl > 0 {
				v.cache.Add(key, &verified{keys: ks, b: b}, ttl)
			}
		}
	}
	if err := v.checkObjects(b); err != nil {
		return nil, err
	}
	c := &authn.Caller{
		Namespace:      b.namespace,
		ServiceAccount: b.serviceAccount.Name,
		// A locally verified bound token is an offline-verified JWT:
		// node authorization (ca/nodeauth) accepts it as it accepts one.
		Method: authn.MethodJWT,
		Expiry: b.expiry,
	}
	if b.pod != nil {
		c.PodName, c.PodUID = b.pod.Name, b.pod.UID
		if b.node != nil {
			c.NodeName = b.node.Name
		}
	}
	return c, nil
}

// jws is a parsed token: a compactToken (the API server's shape, parsed
// here) or a goJOSEToken (anything else).
type jws interface {
	header() (alg, kid string)
	registered() *jwt.Claims
	verifiedBy(key any) bool
	// kubernetes reads the kubernetes.io claims, once the registered ones
	// are valid.
	kubernetes() (*kubeClaims, error)
}

// verify checks token's signature and registered claims and returns what
// it is bound to, with the key set that verified it.
func (v *Verifier) verify(ctx context.Context, token string, ks *keySet) (*binding, *keySet, error) {
	var tok jws
	if !v.goJOSEOnly {
		if t, ok := parseCompact(token); ok {
			tok = t
		}
	}
	if tok == nil {
		t, err := parseGoJOSE(token, ks.issuer)
		if err != nil {
			return nil, nil, err
		}
		tok = t
	}
	cl := tok.registered()
	if cl.Issuer != ks.issuer {
		return nil, nil, &fallback{fallbackIssuer}
	}
	alg, kid := tok.header()
	cands := candidates(ks.keys, kid)
	if len(cands) == 0 && kid != "" {
		// A key the set lacks: perhaps a new signing key. Read the keys
		// again (rate limited), else leave the token to the API server.
		if err := v.refreshForKey(ctx); err == nil {
			ks = v.keys.Load()
			if ks.issuer != cl.Issuer {
				return nil, nil, &fallback{fallbackIssuer}
			}
			cands = candidates(ks.keys, kid)
		}
	}
	if len(cands) == 0 {
		return nil, nil, &fallback{fallbackKey}
	}
	signed := false
	for _, k := range cands {
		if k.Algorithm != "" && k.Algorithm != alg {
			continue
		}
		if tok.verifiedBy(k.Key) {
			signed = true
			break
		}
	}
	switch {
	case !signed && kid == "":
		// Without a key id the token never claimed one of our keys: it may
		// be another cluster's that shares the default issuer name.
		return nil, nil, &fallback{fallbackKey}
	case !signed:
		return nil, nil, unauthenticated("bad token signature")
	}
	// The signature verified: the claims are the issuer's.
	b, err := v.validate(tok, ks.issuer)
	return b, ks, err
}

// goJOSEToken is a token parsed by go-jose.
type goJOSEToken struct {
	tok *jwt.JSONWebToken
	cl  claims
}

// parseGoJOSE parses token with go-jose: any token parseCompact declines.
func parseGoJOSE(token, issuer string) (*goJOSEToken, error) {
	tok, err := jwt.ParseSigned(token, identity.SignatureAlgorithms)
	if err != nil || len(tok.Headers) != 1 {
		// alg none, HS256, a JWE, garbage: ours only when it claims our
		// issuer, which never signs that way.
		if peekIssuer(token) == issuer {
			return nil, unauthenticated("the token is not a JWT signed with a supported algorithm")
		}
		return nil, &fallback{fallbackIssuer}
	}
	t := &goJOSEToken{tok: tok}
	if err := tok.UnsafeClaimsWithoutVerification(&t.cl); err != nil {
		if peekIssuer(token) == issuer {
			return nil, unauthenticated("the token's claims are malformed")
		}
		return nil, &fallback{fallbackIssuer}
	}
	return t, nil
}

func (t *goJOSEToken) header() (string, string) {
	return t.tok.Headers[0].Algorithm, t.tok.Headers[0].KeyID
}

func (t *goJOSEToken) registered() *jwt.Claims { return &t.cl.Claims }

func (t *goJOSEToken) verifiedBy(key any) bool { return t.tok.Claims(key) == nil }

func (t *goJOSEToken) kubernetes() (*kubeClaims, error) {
	for k := range t.cl.Kubernetes {
		if !knownBindingKeys[k] {
			return nil, &fallback{fallbackUnbound}
		}
	}
	var k kubeClaims
	if err := errors.Join(
		field(t.cl.Kubernetes, "namespace", &k.namespace),
		field(t.cl.Kubernetes, "serviceaccount", &k.serviceAccount),
		field(t.cl.Kubernetes, "pod", &k.pod),
		field(t.cl.Kubernetes, "secret", &k.secret),
		field(t.cl.Kubernetes, "node", &k.node),
	); err != nil {
		return nil, unauthenticated("the token's kubernetes.io claims are malformed")
	}
	return &k, nil
}

func (t *compactToken) header() (string, string)         { return t.alg, t.kid }
func (t *compactToken) registered() *jwt.Claims          { return &t.claims }
func (t *compactToken) kubernetes() (*kubeClaims, error) { return &t.kube, nil }

// candidates are the keys that may have signed a token with key id kid:
// those with that id, or every key when the token names none.
func candidates(set *jose.JSONWebKeySet, kid string) []jose.JSONWebKey {
	if kid == "" {
		return set.Keys
	}
	return set.Key(kid)
}

// validate checks the registered claims and reads the binding.
func (v *Verifier) validate(tok jws, issuer string) (*binding, error) {
	cl := tok.registered()
	if len(cl.Audience) == 0 {
		// The API server gives such a token its own API audiences: it
		// decides.
		return nil, &fallback{fallbackUnbound}
	}
	err := cl.ValidateWithLeeway(jwt.Expected{Issuer: issuer, AnyAudience: v.cfg.Audiences, Time: v.clock.Now()}, v.cfg.Leeway)
	switch {
	case errors.Is(err, jwt.ErrExpired):
		return nil, unauthenticated("the token has expired")
	case errors.Is(err, jwt.ErrNotValidYet):
		return nil, unauthenticated("the token is not valid yet (nbf)")
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return nil, unauthenticated("the token is issued in the future (iat)")
	case errors.Is(err, jwt.ErrInvalidAudience):
		return nil, unauthenticated("the token is not valid for audience " + strings.Join(v.cfg.Audiences, ","))
	case err != nil:
		return nil, unauthenticated("invalid token claims")
	}
	if cl.Expiry == nil {
		return nil, unauthenticated("the token has no expiry (exp)")
	}
	k, err := tok.kubernetes()
	if err != nil {
		return nil, err
	}
	b := &binding{kubeClaims: *k, expiry: cl.Expiry.Time()}
	sa := b.serviceAccount
	if b.namespace == "" || sa.Name == "" || sa.UID == "" {
		// No bound service account: not a token of the TokenRequest API.
		return nil, &fallback{fallbackUnbound}
	}
	if b.pod == nil && b.secret == nil && b.node != nil {
		return nil, &fallback{fallbackUnbound} // bound to a node only
	}
	if b.secret != nil && v.objects.secrets == nil {
		return nil, &fallback{fallbackSecretBinding}
	}
	return b, nil
}

// field decodes the kubernetes.io claim name into dst, when present.
func field(m map[string]json.RawMessage, name string, dst any) error {
	raw, ok := m[name]
	if !ok {
		return nil
	}
	return json.Unmarshal(raw, dst)
}

// checkObjects is what a TokenReview adds to the signature: the service
// account and the bound pod or secret exist with the token's UIDs and were
// not deleted more than DeletedLeeway ago.
func (v *Verifier) checkObjects(b *binding) error {
	deletedBefore := v.clock.Now().Add(-DeletedLeeway)
	checks := []struct {
		what string
		inf  *kubeclient.MetadataInformer
		ref  *ref
	}{
		{"service account", v.objects.sas, &b.serviceAccount},
		{"secret", v.objects.secrets, b.secret},
		{"pod", v.objects.pods, b.pod},
	}
	for _, c := range checks {
		if c.ref == nil {
			continue
		}
		err := check(c.inf, b.namespace, c.ref.Name, c.ref.UID, deletedBefore)
		switch {
		case errors.Is(err, errDeleted):
			return unauthenticated("the token's " + c.what + " has been deleted")
		case err != nil:
			return &fallback{fallbackObject}
		}
	}
	return nil
}

func unauthenticated(msg string) error {
	return ca.Errorf(ca.KindUnauthenticated, "boundtoken: %s", msg)
}

// peekIssuer reads the iss claim of a compact JWS WITHOUT any check, only
// to tell whether a token that go-jose refused claims to be the cluster's.
func peekIssuer(token string) string {
	_, rest, ok := strings.Cut(token, ".")
	if !ok {
		return ""
	}
	payload, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return ""
	}
	var c struct {
		Issuer string `json:"iss"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return ""
	}
	return c.Issuer
}
