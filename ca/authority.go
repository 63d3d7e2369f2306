package ca

import (
	"cmp"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults, as in Istio (DEFAULT_WORKLOAD_CERT_TTL, MAX_WORKLOAD_CERT_TTL).
const (
	DefaultTTL       = 24 * time.Hour
	DefaultMaxTTL    = 90 * 24 * time.Hour
	DefaultClockSkew = time.Minute
)

// Config configures an Authority.
type Config struct {
	TrustDomain spiffeid.TrustDomain
	Bundle      *keystore.Bundle
	DefaultTTL  time.Duration // 0 -> 24h
	MaxTTL      time.Duration // 0 -> 2160h (90d)
	ClockSkew   time.Duration // NotBefore backdating; 0 -> 1m
	// CapTTLToToken caps a leaf issued on a token at the token's expiry
	// (Request.CredentialExpiry), so that access ends with the token.
	// Default false, as in Istio: a leaf then lives its TTL even when its
	// token expires sooner. Leaves issued on a client-certificate renewal
	// are always capped at the presented certificate's NotAfter.
	CapTTLToToken bool
	Clock         clock.Clock
	Logger        *slog.Logger          // nil discards logs (audit lines too); cmd always sets one
	Registerer    prometheus.Registerer // nil -> no metrics registered
}

// Authority signs leaf certificates for proven SPIFFE identities. Sign is
// safe for concurrent use and takes no lock: the CA material is an
// immutable snapshot behind an atomic pointer, replaced by SetBundle.
type Authority struct {
	td         spiffeid.TrustDomain
	defaultTTL time.Duration
	maxTTL     time.Duration
	skew       time.Duration
	capToToken bool
	clock      clock.Clock
	log        *slog.Logger
	metrics    *metrics
	state      atomic.Pointer[issuer]
}

// Request asks for a leaf certificate.
type Request struct {
	// CSR is the verified request, from ParseCSR or VerifyCSR.
	CSR    *CSR
	ID     spiffeid.ID   // the identity the caller PROVED (from authn)
	Caller string        // for the audit log, e.g. "ns/sa (jwt)"
	TTL    time.Duration // 0 = default; > MaxTTL = InvalidArgument
	// Renewal is the client certificate the caller proved ID with, when it
	// renews with a certificate instead of a token (authn.Caller's
	// Certificate). The leaf never outlives it, so a workload whose token
	// is gone keeps its identity only until the last certificate proved by
	// a token expires; the audit line names its serial.
	Renewal *x509.Certificate
	// CredentialExpiry is when the caller's token expires (authn.Caller's
	// Expiry; zero if unknown). With Config.CapTTLToToken, the leaf never
	// outlives it.
	CredentialExpiry time.Time
}

// Issued is a signed leaf with what a client needs to present and verify it.
// Chain and Roots are shared between requests: do not modify their elements.
type Issued struct {
	Leaf  *x509.Certificate
	Chain []*x509.Certificate // Cert of the bundle (if not a root) then Intermediates, i.e. everything between leaf and roots
	Roots []*x509.Certificate
}

// New returns an Authority that signs with cfg.Bundle.
func New(cfg Config) (*Authority, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("ca: trust domain is required")
	}
	if cfg.Bundle == nil {
		return nil, errors.New("ca: CA bundle is required")
	}
	cfg.DefaultTTL = cmp.Or(cfg.DefaultTTL, DefaultTTL)
	cfg.MaxTTL = cmp.Or(cfg.MaxTTL, DefaultMaxTTL)
	cfg.ClockSkew = cmp.Or(cfg.ClockSkew, DefaultClockSkew)
	switch {
	case cfg.DefaultTTL < 0 || cfg.MaxTTL < 0 || cfg.ClockSkew < 0:
		return nil, errors.New("ca: TTLs and clock skew must not be negative")
	case cfg.DefaultTTL > cfg.MaxTTL:
		return nil, fmt.Errorf("ca: default TTL %v exceeds the maximum TTL %v", cfg.DefaultTTL, cfg.MaxTTL)
	}
	a := &Authority{
		td:         cfg.TrustDomain,
		defaultTTL: cfg.DefaultTTL,
		maxTTL:     cfg.MaxTTL,
		skew:       cfg.ClockSkew,
		capToToken: cfg.CapTTLToToken,
		clock:      clock.OrReal(cfg.Clock),
		log:        logs.OrDiscard(cfg.Logger),
	}
	if err := a.SetBundle(cfg.Bundle); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, a.state.Load)
	if err != nil {
		return nil, fmt.Errorf("ca: metrics: %w", err)
	}
	a.metrics = m
	return a, nil
}

// TrustDomain returns the trust domain the Authority issues identities in.
func (a *Authority) TrustDomain() spiffeid.TrustDomain { return a.td }

// Bundle returns the CA material in use.
func (a *Authority) Bundle() *keystore.Bundle { return a.state.Load().bundle }

// SetBundle validates b and switches signing to it. Requests already being
// signed finish with the previous bundle. The bundle must not be modified
// afterwards.
func (a *Authority) SetBundle(b *keystore.Bundle) error {
	is, err := a.issuerFor(b)
	if err != nil {
		return err
	}
	a.state.Store(is)
	a.log.Info("CA bundle in use",
		slog.String("subject", b.Cert.Subject.String()),
		slog.String("key", certs.KeyTypeOf(b.Cert.PublicKey)),
		slog.Time("not_after", b.Cert.NotAfter),
		slog.Int("intermediates", len(b.Intermediates)),
		slog.Int("roots", len(b.Roots)))
	return nil
}

// Sign applies the CSR policy to req and signs a leaf for req.ID. A CSR
// that breaks the policy is InvalidArgument; one that asks for another
// identity is PermissionDenied.
func (a *Authority) Sign(ctx context.Context, req Request) (*Issued, error) {
	start := a.clock.Now()
	is := a.state.Load()
	leaf, err := a.sign(ctx, is, req, start)
	if err != nil {
		reason := reasonInternal
		if r := (*rejection)(nil); errors.As(err, &r) {
			reason = r.reason
		}
		a.metrics.failures[reason].Inc()
		level := slog.LevelInfo
		if KindOf(err) == KindPermissionDenied || KindOf(err) == KindInternal {
			level = slog.LevelWarn
		}
		a.log.LogAttrs(ctx, level, "certificate request refused",
			slog.String("spiffe_id", req.ID.String()),
			slog.String("caller", req.Caller),
			slog.String("reason", reason),
			slog.String("error", err.Error()))
		return nil, err
	}
	a.metrics.issued.Inc()
	a.metrics.duration.Observe(a.clock.Now().Sub(start).Seconds())
	a.audit(ctx, "certificate issued", leaf, req.ID.String(), req.Caller, req.Renewal, is.cuts(leaf))
	return &Issued{Leaf: leaf, Chain: is.chain, Roots: is.roots}, nil
}

func (a *Authority) sign(ctx context.Context, is *issuer, req Request, now time.Time) (*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, &rejection{reason: reasonUnavailable, err: &Error{Kind: KindUnavailable, Msg: "request canceled", Err: err}}
	}
	if req.ID.IsZero() {
		return nil, Errorf(KindInternal, "request has no caller identity")
	}
	if req.ID.TrustDomain() != a.td {
		return nil, reject(reasonIdentity, KindPermissionDenied, "identity %q is not in trust domain %q", req.ID.String(), a.td.Name())
	}
	if req.CSR == nil || req.CSR.req == nil {
		return nil, reject(reasonBadCSR, KindInvalidArgument, "request has no CSR")
	}
	csr := req.CSR.req // its key and signature were checked by VerifyCSR
	if err := checkCSR(csr, req.ID); err != nil {
		return nil, err
	}
	notBefore, notAfter, err := a.validity(is, now, req.TTL)
	if err != nil {
		return nil, err
	}
	if notAfter, err = a.credential(req).Cap(now, notAfter); err != nil {
		return nil, err
	}
	spki, err := marshalSPKI(csr.PublicKey)
	if err != nil {
		return nil, reject(reasonWeakKey, KindInvalidArgument, "CSR public key cannot be encoded")
	}
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, Wrap(KindInternal, err, "serial number")
	}
	_, isRSA := csr.PublicKey.(*rsa.PublicKey)
	leaf, err := is.issue(&leafSpec{
		serial:    serial,
		notBefore: notBefore,
		notAfter:  notAfter,
		pub:       csr.PublicKey,
		spki:      spki,
		rsaKey:    isRSA,
		uri:       req.ID.String(),
	})
	if err != nil {
		return nil, Wrap(KindInternal, err, "signing failed")
	}
	return leaf, nil
}

// credential is what bounds req's leaf (Credential.Cap): the presented
// certificate of a renewal, or, with CapTTLToToken only, the token's
// expiry (by default a leaf lives its TTL past its token, as in Istio).
func (a *Authority) credential(req Request) Credential {
	c := Credential{Certificate: req.Renewal}
	if a.capToToken {
		c.TokenExpiry = req.CredentialExpiry
	}
	return c
}

// validity returns the leaf's NotBefore (now minus the clock skew, but not
// before the issuer's) and NotAfter (now plus ttl, but not after anything on
// the path to the root).
func (a *Authority) validity(is *issuer, now time.Time, ttl time.Duration) (time.Time, time.Time, error) {
	switch {
	case ttl < 0:
		return time.Time{}, time.Time{}, reject(reasonTTL, KindInvalidArgument, "requested TTL %v is negative", ttl)
	case ttl == 0:
		ttl = a.defaultTTL
	case ttl > a.maxTTL:
		return time.Time{}, time.Time{}, reject(reasonTTL, KindInvalidArgument, "requested TTL %v exceeds the maximum %v", ttl, a.maxTTL)
	}
	return window(is, now, ttl, a.skew)
}

// window is the validity of a certificate issued at now for ttl by is:
// backdated by skew (not before is's own start), cut at is's expiry.
func window(is *issuer, now time.Time, ttl, skew time.Duration) (time.Time, time.Time, error) {
	if !now.Before(is.notAfter) {
		return time.Time{}, time.Time{}, reject(reasonUnavailable, KindUnavailable, "CA certificate chain expired at %s", is.notAfter.UTC().Format(time.RFC3339))
	}
	notBefore := now.Add(-skew)
	if notBefore.Before(is.cert.NotBefore) {
		notBefore = is.cert.NotBefore
	}
	notAfter := now.Add(ttl)
	if notAfter.After(is.notAfter) {
		notAfter = is.notAfter
	}
	return notBefore, notAfter, nil
}

// IssueServing issues the TLS serving certificate of the CA's own gRPC
// endpoint for pub, with the given DNS and IP SANs. It is not on the hot
// path and uses x509.CreateCertificate, which verifies its signature. ttl
// is independent of the workload TTL limits; 0 means 24h.
func (a *Authority) IssueServing(pub crypto.PublicKey, dnsNames []string, ips []net.IP, ttl time.Duration) (*Issued, error) {
	is := a.state.Load()
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, Errorf(KindInvalidArgument, "serving certificate needs a DNS name or an IP address")
	}
	if err := checkLeafKey(pub); err != nil {
		return nil, err
	}
	// The serving certificate's lifetime is the server's own setting, not
	// a workload's request: the workload TTL limits (Config.DefaultTTL and
	// MaxTTL) do not apply to it, so `--max-ttl 3m` still serves (issue
	// 19). 0 means the package's DefaultTTL (24h); it is still cut at the
	// CA certificate's expiry.
	switch {
	case ttl < 0:
		return nil, Errorf(KindInvalidArgument, "serving certificate TTL %v is negative", ttl)
	case ttl == 0:
		ttl = DefaultTTL
	}
	notBefore, notAfter, err := window(is, a.clock.Now(), ttl, a.skew)
	if err != nil {
		return nil, err
	}
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, Wrap(KindInternal, err, "serial number")
	}
	ku := x509.KeyUsageDigitalSignature
	if _, ok := pub.(*rsa.PublicKey); ok {
		ku |= x509.KeyUsageKeyEncipherment
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              ku,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              dnsNames,
		IPAddresses:           ips,
		SignatureAlgorithm:    is.sigAlg,
	}
	if len(dnsNames) > 0 {
		tmpl.Subject = pkix.Name{CommonName: dnsNames[0]}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, pub, is.key)
	if err != nil {
		return nil, Wrap(KindInternal, err, "signing the serving certificate failed")
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, Wrap(KindInternal, err, "parsing the serving certificate failed")
	}
	a.metrics.issued.Inc()
	a.audit(context.Background(), "serving certificate issued", leaf, "", "meshid server", nil, is.cuts(leaf))
	return &Issued{Leaf: leaf, Chain: is.chain, Roots: is.roots}, nil
}

// cuts reports whether leaf ends when is's chain does: its lifetime was
// cut so that it does not outlive the CA certificate that signed it.
func (is *issuer) cuts(leaf *x509.Certificate) bool {
	return !leaf.NotAfter.Before(is.notAfter.Truncate(time.Second))
}

// audit writes the one log line of an issued certificate.
// renewal, when set, is the client certificate the caller renewed with;
// cut says that its NotAfter was cut at the CA chain's expiry
// (not_after_cut=ca_expiry).
func (a *Authority) audit(ctx context.Context, msg string, leaf *x509.Certificate, id, caller string, renewal *x509.Certificate, cut bool) {
	if !a.log.Enabled(ctx, slog.LevelInfo) {
		return // the attributes cost a serial-to-hex conversion and allocations per certificate
	}
	// The record is built here and handed to the handler, as
	// Logger.LogAttrs would, but without the caller's program counter
	// (runtime.Callers on every certificate; no handler of meshid adds
	// the source), and with its first five attributes inline.
	r := slog.NewRecord(time.Now(), slog.LevelInfo, msg, 0)
	r.AddAttrs(
		slog.String("serial", leaf.SerialNumber.Text(16)),
		slog.String("spiffe_id", id),
		slog.String("caller", caller),
		slog.Time("not_after", leaf.NotAfter),
		slog.String("key", certs.KeyTypeOf(leaf.PublicKey)),
	)
	if renewal != nil {
		r.AddAttrs(slog.String("renewed_serial", renewal.SerialNumber.Text(16)))
	}
	if cut {
		r.AddAttrs(slog.String("not_after_cut", "ca_expiry"))
	}
	if len(leaf.DNSNames) > 0 {
		r.AddAttrs(slog.Any("dns_names", leaf.DNSNames))
	}
	_ = a.log.Handler().Handle(ctx, r) // as Logger.LogAttrs, a handler's error is dropped
}
