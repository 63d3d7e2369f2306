package jwtissuer

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/metric"
)

// Defaults and limits of a Config.
const (
	// DefaultTTL is the lifetime of a JWT-SVID: a bearer token, so short.
	DefaultTTL = 5 * time.Minute
	// MaxTTL is the longest TTL a Config may set.
	MaxTTL = time.Hour
	// DefaultKeyLifetime is how long one signing key signs (and how long
	// it is published before it does): jwtkeys.DefaultLifetime.
	DefaultKeyLifetime = jwtkeys.DefaultLifetime
	// DefaultMaxAudiences bounds the audiences of one token.
	DefaultMaxAudiences = 16
	// DefaultMaxAudienceLength bounds one audience, in bytes.
	DefaultMaxAudienceLength = 256
)

// KeySource holds the signing keys: the Set returned is right for the
// current time. *jwtkeys.Local (one process) and *jwtsecret.Store (the
// replicas of a CA in Kubernetes, ca/kube/jwtsecret) are ones.
type KeySource interface {
	Keys() (*jwtkeys.Set, error)
}

// Config configures an Issuer.
type Config struct {
	// TrustDomain of the tokens' subjects. Required.
	TrustDomain spiffeid.TrustDomain
	// TTL is the tokens' lifetime; 0 means DefaultTTL, at most MaxTTL. A
	// Keys source must keep retired keys published for at least as long.
	TTL time.Duration
	// Keys holds the signing keys; nil keeps them in memory (a
	// jwtkeys.Local without a directory) with KeyLifetime.
	Keys KeySource
	// KeyLifetime is how long each in-memory signing key signs; 0 means
	// DefaultKeyLifetime, within jwtkeys.MinLifetime and MaxLifetime.
	// Unused with Keys.
	KeyLifetime time.Duration
	// MaxAudiences and MaxAudienceLength bound a request's audiences; 0
	// means DefaultMaxAudiences and DefaultMaxAudienceLength.
	MaxAudiences      int
	MaxAudienceLength int

	Clock      clock.Clock
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
}

// Issuer mints JWT-SVIDs and publishes their keys. It is safe for
// concurrent use.
type Issuer struct {
	td        spiffeid.TrustDomain
	ttl       time.Duration
	keys      KeySource
	maxAud    int
	maxAudLen int
	clock     clock.Clock
	issued    prometheus.Counter

	mu      sync.Mutex
	signers map[string]jose.Signer // by key ID, of the keys last seen
	jwksOf  []string               // the key IDs jwks holds
	jwks    []byte
}

// New validates cfg and returns an Issuer.
func New(cfg Config) (*Issuer, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("jwtissuer: Config.TrustDomain is required")
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultTTL)
	cfg.MaxAudiences = cmp.Or(cfg.MaxAudiences, DefaultMaxAudiences)
	cfg.MaxAudienceLength = cmp.Or(cfg.MaxAudienceLength, DefaultMaxAudienceLength)
	switch {
	case cfg.TTL < 0 || cfg.TTL > MaxTTL:
		return nil, fmt.Errorf("jwtissuer: TTL %s is not within 0 to %s", cfg.TTL, MaxTTL)
	case cfg.MaxAudiences < 0 || cfg.MaxAudienceLength < 0:
		return nil, errors.New("jwtissuer: audience limits must not be negative")
	}
	if cfg.Keys == nil {
		local, err := jwtkeys.NewLocal(jwtkeys.LocalConfig{
			Lifetime: cfg.KeyLifetime, TTL: cfg.TTL, Clock: cfg.Clock, Logger: cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("jwtissuer: %w", err)
		}
		cfg.Keys = local
	}
	i := &Issuer{
		td: cfg.TrustDomain, ttl: cfg.TTL, keys: cfg.Keys,
		maxAud: cfg.MaxAudiences, maxAudLen: cfg.MaxAudienceLength,
		clock:   clock.OrReal(cfg.Clock),
		issued:  metric.Counter("meshid_ca_jwtsvid_issued_total", "JWT-SVIDs issued by the CA."),
		signers: map[string]jose.Signer{},
	}
	if cfg.Registerer != nil {
		if err := metric.Register(cfg.Registerer, i.issued); err != nil {
			return nil, err
		}
	}
	return i, nil
}

// TrustDomain is the trust domain of the tokens and of the bundle.
func (i *Issuer) TrustDomain() spiffeid.TrustDomain { return i.td }

// TTL is the lifetime of the tokens.
func (i *Issuer) TTL() time.Duration { return i.ttl }

// keySet returns the source's Set, as a ca error.
func (i *Issuer) keySet() (*jwtkeys.Set, error) {
	set, err := i.keys.Keys()
	if err != nil {
		return nil, ca.Wrap(ca.KindUnavailable, err, "the JWT signing keys are not available")
	}
	return set, nil
}

// signer returns the signer of k, made once per key.
func (i *Issuer) signer(k jwtkeys.Key) (jose.Signer, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if s, ok := i.signers[k.ID]; ok {
		return s, nil
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k.Private},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), k.ID))
	if err != nil {
		return nil, fmt.Errorf("jwtissuer: signer: %w", err)
	}
	if len(i.signers) >= 2*jwtkeys.MaxKeys { // keys come and go: forget the old ones
		clear(i.signers)
	}
	i.signers[k.ID] = s
	return s, nil
}

// JWKS returns the bundle (an RFC 7517 key set) that verifies every token
// not yet expired, and the next key. The slice must not be modified.
func (i *Issuer) JWKS() ([]byte, error) {
	set, err := i.keySet()
	if err != nil {
		return nil, err
	}
	keys := set.Published(i.clock.Now(), i.ttl)
	ids := make([]string, len(keys))
	for n, k := range keys {
		ids[n] = k.ID
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if slices.Equal(ids, i.jwksOf) {
		return i.jwks, nil
	}
	jwks := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(keys))}
	for _, k := range keys {
		jwks.Keys = append(jwks.Keys, jose.JSONWebKey{Key: k.Private.Public(), KeyID: k.ID, Algorithm: string(jose.ES256), Use: "jwt-svid"})
	}
	b, err := json.Marshal(jwks)
	if err != nil {
		return nil, ca.Wrap(ca.KindInternal, err, "cannot encode the JWKS")
	}
	i.jwks, i.jwksOf = b, ids
	return b, nil
}

// Token is a minted JWT-SVID.
type Token struct {
	Token  string
	KeyID  string
	Expiry time.Time
}

// Issue mints a JWT-SVID for id with audience that no caller's credential
// bounds, for in-process signers (IssueFor with a zero ca.Credential). The
// CA's endpoint uses IssueFor.
func (i *Issuer) Issue(id spiffeid.ID, audience []string) (*Token, error) {
	return i.IssueFor(id, audience, ca.Credential{})
}

// IssueFor mints a JWT-SVID for id with audience, for a caller that proved
// id with cred. The audience must name 1 to MaxAudiences non-empty, valid
// UTF-8 values of at most MaxAudienceLength bytes (InvalidArgument
// otherwise); id must be in the trust domain. The token expires after the
// TTL, but never after cred (ca.Credential.Cap, the rule of X.509 leaves:
// issue 28, hole 4); an expired cred is Unauthenticated.
func (i *Issuer) IssueFor(id spiffeid.ID, audience []string, cred ca.Credential) (*Token, error) {
	if err := i.CheckAudience(audience); err != nil {
		return nil, err
	}
	if id.TrustDomain() != i.td {
		return nil, ca.Errorf(ca.KindPermissionDenied, "%s is not in trust domain %s", id, i.td.Name())
	}
	set, err := i.keySet()
	if err != nil {
		return nil, err
	}
	now := i.clock.Now()
	k, ok := set.Signing(now)
	if !ok {
		return nil, ca.Errorf(ca.KindUnavailable, "no JWT signing key is current (the leader has not rotated the keys)")
	}
	signer, err := i.signer(k)
	if err != nil {
		return nil, ca.Wrap(ca.KindInternal, err, "cannot sign the JWT-SVID")
	}
	exp, err := cred.Cap(now, now.Add(i.ttl))
	if err != nil {
		return nil, err
	}
	claims := jwt.Claims{
		Subject:  id.String(),
		Audience: jwt.Audience(audience),
		IssuedAt: jwt.NewNumericDate(now),
		Expiry:   jwt.NewNumericDate(exp),
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		return nil, ca.Wrap(ca.KindInternal, err, "cannot sign the JWT-SVID")
	}
	i.issued.Inc()
	return &Token{Token: tok, KeyID: k.ID, Expiry: exp.Truncate(time.Second)}, nil
}

// CheckAudience returns InvalidArgument unless audience is acceptable for
// Issue.
func (i *Issuer) CheckAudience(audience []string) error {
	switch {
	case len(audience) == 0:
		return ca.Errorf(ca.KindInvalidArgument, "a JWT-SVID needs at least one audience")
	case len(audience) > i.maxAud:
		return ca.Errorf(ca.KindInvalidArgument, "%d audiences, more than the limit of %d", len(audience), i.maxAud)
	}
	for n, a := range audience {
		switch {
		case a == "":
			return ca.Errorf(ca.KindInvalidArgument, "audience %d is empty", n)
		case len(a) > i.maxAudLen:
			return ca.Errorf(ca.KindInvalidArgument, "audience %d is %d bytes, more than the limit of %d", n, len(a), i.maxAudLen)
		case !utf8.ValidString(a):
			return ca.Errorf(ca.KindInvalidArgument, "audience %d is not valid UTF-8", n)
		}
	}
	return nil
}
