package jwtissuer

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
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
	// it is published before it does).
	DefaultKeyLifetime = 24 * time.Hour
	// MinKeyLifetime is the shortest KeyLifetime: validators must have
	// time to fetch a key before it signs.
	MinKeyLifetime = 10 * time.Minute
	// DefaultMaxAudiences bounds the audiences of one token.
	DefaultMaxAudiences = 16
	// DefaultMaxAudienceLength bounds one audience, in bytes.
	DefaultMaxAudienceLength = 256
)

// Config configures an Issuer.
type Config struct {
	// TrustDomain of the tokens' subjects. Required.
	TrustDomain spiffeid.TrustDomain
	// TTL is the tokens' lifetime; 0 means DefaultTTL, at most MaxTTL.
	TTL time.Duration
	// KeyLifetime is how long each signing key signs; 0 means
	// DefaultKeyLifetime, at least MinKeyLifetime.
	KeyLifetime time.Duration
	// MaxAudiences and MaxAudienceLength bound a request's audiences; 0
	// means DefaultMaxAudiences and DefaultMaxAudienceLength.
	MaxAudiences      int
	MaxAudienceLength int

	Clock      clock.Clock
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
}

// key is one signing key and the interval in which it signs.
type key struct {
	id           string // RFC 7638 thumbprint, base64url
	priv         *ecdsa.PrivateKey
	signer       jose.Signer
	from, until  time.Time
	retiredUntil time.Time // until + TTL: published until then
}

// Issuer mints JWT-SVIDs and publishes their keys. It is safe for
// concurrent use.
type Issuer struct {
	td        spiffeid.TrustDomain
	ttl       time.Duration
	lifetime  time.Duration
	maxAud    int
	maxAudLen int
	clock     clock.Clock
	log       *slog.Logger
	issued    prometheus.Counter
	rotations prometheus.Counter

	mu   sync.Mutex
	keys []*key // published, oldest first; keys[len-2] signs, keys[len-1] is next
	jwks []byte // of keys, rebuilt when they change
}

// New validates cfg and returns an Issuer holding its first two keys (the
// signing one and the next, already published).
func New(cfg Config) (*Issuer, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("jwtissuer: Config.TrustDomain is required")
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultTTL)
	cfg.KeyLifetime = cmp.Or(cfg.KeyLifetime, DefaultKeyLifetime)
	cfg.MaxAudiences = cmp.Or(cfg.MaxAudiences, DefaultMaxAudiences)
	cfg.MaxAudienceLength = cmp.Or(cfg.MaxAudienceLength, DefaultMaxAudienceLength)
	switch {
	case cfg.TTL < 0 || cfg.TTL > MaxTTL:
		return nil, fmt.Errorf("jwtissuer: TTL %s is not within 0 to %s", cfg.TTL, MaxTTL)
	case cfg.KeyLifetime < MinKeyLifetime:
		return nil, fmt.Errorf("jwtissuer: key lifetime %s is shorter than %s", cfg.KeyLifetime, MinKeyLifetime)
	case cfg.MaxAudiences < 0 || cfg.MaxAudienceLength < 0:
		return nil, errors.New("jwtissuer: audience limits must not be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	i := &Issuer{
		td: cfg.TrustDomain, ttl: cfg.TTL, lifetime: cfg.KeyLifetime,
		maxAud: cfg.MaxAudiences, maxAudLen: cfg.MaxAudienceLength,
		clock: clock.OrReal(cfg.Clock), log: cfg.Logger,
		issued:    metric.Counter("meshid_jwtsvid_issued_total", "JWT-SVIDs issued by the CA."),
		rotations: metric.Counter("meshid_jwtsvid_key_rotations_total", "JWT signing keys retired for the next one."),
	}
	if cfg.Registerer != nil {
		if err := metric.Register(cfg.Registerer, i.issued, i.rotations); err != nil {
			return nil, err
		}
	}
	now := i.clock.Now()
	cur, err := i.newKey(now)
	if err != nil {
		return nil, err
	}
	next, err := i.newKey(cur.until)
	if err != nil {
		return nil, err
	}
	i.keys = []*key{cur, next}
	if err := i.rebuild(); err != nil {
		return nil, err
	}
	return i, nil
}

// TrustDomain is the trust domain of the tokens and of the bundle.
func (i *Issuer) TrustDomain() spiffeid.TrustDomain { return i.td }

// TTL is the lifetime of the tokens.
func (i *Issuer) TTL() time.Duration { return i.ttl }

// newKey generates a P-256 key that signs from from for one lifetime.
func (i *Issuer) newKey(from time.Time) (*key, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("jwtissuer: generate key: %w", err)
	}
	jwk := jose.JSONWebKey{Key: priv.Public(), Algorithm: string(jose.ES256), Use: "sig"}
	tp, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("jwtissuer: key thumbprint: %w", err)
	}
	kid := base64.RawURLEncoding.EncodeToString(tp)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: priv},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return nil, fmt.Errorf("jwtissuer: signer: %w", err)
	}
	until := from.Add(i.lifetime)
	return &key{id: kid, priv: priv, signer: signer, from: from, until: until, retiredUntil: until.Add(i.ttl)}, nil
}

// rotateLocked makes the key set right for now: the key that signs at now
// and the next one published, retired keys kept until their last token
// expires. A clock that jumped far ahead starts over with fresh keys.
func (i *Issuer) rotateLocked(now time.Time) error {
	changed := false
	for cur := i.keys[len(i.keys)-2]; !now.Before(cur.until); cur = i.keys[len(i.keys)-2] {
		from := i.keys[len(i.keys)-1].until
		if now.Sub(from) >= i.lifetime { // more than a lifetime without a call
			from = now
		}
		next, err := i.newKey(from)
		if err != nil {
			return err
		}
		i.keys = append(i.keys, next)
		i.rotations.Inc()
		changed = true
		i.log.Info("JWT signing key rotated", "kid", i.keys[len(i.keys)-2].id, "next_kid", next.id)
	}
	keep := i.keys[:0]
	for n, k := range i.keys {
		if n >= len(i.keys)-2 || now.Before(k.retiredUntil) {
			keep = append(keep, k)
		} else {
			changed = true
		}
	}
	i.keys = keep
	if !changed {
		return nil
	}
	return i.rebuild()
}

// rebuild encodes the JWKS of the published keys.
func (i *Issuer) rebuild() error {
	set := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(i.keys))}
	for _, k := range i.keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.id, Algorithm: string(jose.ES256), Use: "jwt-svid"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		return fmt.Errorf("jwtissuer: encode JWKS: %w", err)
	}
	i.jwks = b
	return nil
}

// JWKS returns the bundle (an RFC 7517 key set) that verifies every token
// not yet expired, and the next key. The slice must not be modified.
func (i *Issuer) JWKS() ([]byte, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if err := i.rotateLocked(i.clock.Now()); err != nil {
		return nil, err
	}
	return i.jwks, nil
}

// Token is a minted JWT-SVID.
type Token struct {
	Token  string
	KeyID  string
	Expiry time.Time
}

// Issue mints a JWT-SVID for id with audience. The audience must name 1 to
// MaxAudiences non-empty, valid UTF-8 values of at most MaxAudienceLength
// bytes (InvalidArgument otherwise); id must be in the trust domain.
func (i *Issuer) Issue(id spiffeid.ID, audience []string) (*Token, error) {
	if err := i.CheckAudience(audience); err != nil {
		return nil, err
	}
	if id.TrustDomain() != i.td {
		return nil, ca.Errorf(ca.KindPermissionDenied, "%s is not in trust domain %s", id, i.td.Name())
	}
	i.mu.Lock()
	now := i.clock.Now()
	err := i.rotateLocked(now)
	k := i.keys[len(i.keys)-2]
	i.mu.Unlock()
	if err != nil {
		return nil, ca.Wrap(ca.KindInternal, err, "cannot rotate the JWT signing key")
	}
	exp := now.Add(i.ttl)
	claims := jwt.Claims{
		Subject:  id.String(),
		Audience: jwt.Audience(audience),
		IssuedAt: jwt.NewNumericDate(now),
		Expiry:   jwt.NewNumericDate(exp),
	}
	tok, err := jwt.Signed(k.signer).Claims(claims).Serialize()
	if err != nil {
		return nil, ca.Wrap(ca.KindInternal, err, "cannot sign the JWT-SVID")
	}
	i.issued.Inc()
	return &Token{Token: tok, KeyID: k.id, Expiry: exp.Truncate(time.Second)}, nil
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
