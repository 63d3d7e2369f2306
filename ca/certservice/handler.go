package certservice

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/logs"
)

// CreateCertificate implements IstioCertificateService: it signs the CSR
// for the identity the caller proved. The response's cert_chain is the
// leaf, then each intermediate as its own element, then the root bundle as
// one last element.
func (s *Server) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	start := s.clock.Now()
	resp, caller, err := s.create(ctx, req)
	s.metrics.duration.Observe(s.clock.Now().Sub(start).Seconds())
	code := Code(err)
	s.metrics.request(code)
	if err != nil {
		s.logFailure(ctx, err, caller, req)
		return nil, toStatus(err)
	}
	return resp, nil
}

func (s *Server) create(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, *authn.Caller, error) {
	ttl, err := requestTTL(req.GetValidityDuration())
	if err != nil {
		return nil, nil, err
	}
	cluster, err := clusterID(req.GetMetadata())
	if err != nil {
		return nil, nil, err
	}
	caller, id, err := s.authenticate(ctx, cluster)
	if err != nil {
		return nil, caller, err
	}
	csr, err := ca.ParseCSR([]byte(req.GetCsr()))
	if err != nil {
		return nil, caller, err
	}
	if caller.Method == authn.MethodClientCert && caller.Certificate == nil {
		return nil, caller, ca.Errorf(ca.KindInternal, "client-certificate caller without its certificate")
	}
	audit := caller.String()
	if id, audit, err = s.impersonate(ctx, caller, req, csr, id); err != nil {
		return nil, caller, err
	}
	issued, err := s.authority.Sign(ctx, ca.Request{
		CSR: csr, ID: id, Caller: audit, TTL: ttl,
		Renewal:          caller.Certificate,
		CredentialExpiry: caller.Expiry,
	})
	if err != nil {
		return nil, caller, err
	}
	if caller.Cluster != "" {
		s.log.Debug("certificate request from a remote cluster", logs.KeyClusterID, caller.Cluster, logs.KeyCaller, caller.String())
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: s.pem.chain(issued)}, caller, nil
}

// authenticate proves the caller of ctx (bearer token or client
// certificate, through the authn chain) and applies its rate limit: the
// one authentication of every CA method. It returns the caller (nil when
// not authenticated) and the SPIFFE ID it proved.
func (s *Server) authenticate(ctx context.Context, cluster string) (*authn.Caller, spiffeid.ID, error) {
	creds := credentialsFrom(ctx)
	creds.ClusterID = cluster
	if err := authn.CheckTokenSize(creds.Token, s.maxToken); err != nil {
		return nil, spiffeid.ID{}, err
	}
	caller, err := s.authn.Authenticate(ctx, creds)
	if errors.Is(err, authn.ErrNoCredentials) { // a lone authenticator, not a chain
		err = ca.Wrap(ca.KindUnauthenticated, err, "no credentials: send an \"authorization: Bearer <token>\" header or a client certificate")
	}
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	markServed(ctx) // the connection has proved a caller: no first-request timeout
	s.metrics.authenticated(caller.Method)
	id, err := caller.ID(s.authority.TrustDomain())
	if err != nil {
		return caller, spiffeid.ID{}, ca.Wrap(ca.KindPermissionDenied, err, "the caller's namespace and service account do not form a valid SPIFFE ID")
	}
	if s.limiters != nil && !s.limiters.allow(id.String(), s.clock.Now()) {
		return caller, spiffeid.ID{}, ca.Errorf(ca.KindResourceExhausted, "rate limit exceeded for %s, retry later", id)
	}
	// A caller that left while it was being authenticated (a TokenReview
	// can take seconds) gets nothing signed: a certificate or JWT-SVID
	// nobody reads costs CPU and an audit line, and an agent whose
	// waiters all gave up must not make the CA mint for them (issue 28).
	if err := ctx.Err(); err != nil {
		return caller, spiffeid.ID{}, err
	}
	return caller, id, nil
}

// ImpersonatedIdentityKey is the request metadata key in which a node agent
// (Istio's ztunnel) names the workload it asks a certificate for. The key
// is case-sensitive, as in Istio; a key that differs from it only in case
// is refused rather than ignored, so a client's typo is never silently
// read as a request for the caller's own identity.
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// MaxImpersonatedIdentity is the longest ImpersonatedIdentity value read:
// 2048 bytes, the SPIFFE ID length limit of the SPIFFE specification.
const MaxImpersonatedIdentity = 2048

// impersonate handles ImpersonatedIdentity. Without it, it returns id, the
// caller's own identity, and the caller's name for the audit line. With
// it, the CSR's one URI SAN must be the impersonated identity, node
// authorization must allow it (s.nodeAuth; without one, node mode is off
// and every impersonation is refused), and it returns the impersonated
// identity and an audit name that says who impersonated it.
func (s *Server) impersonate(ctx context.Context, caller *authn.Caller, req *securityv1alpha1.IstioCertificateRequest, csr *ca.CSR, id spiffeid.ID) (spiffeid.ID, string, error) {
	target, ok, err := impersonatedIdentity(req.GetMetadata())
	if err != nil || !ok {
		return id, caller.String(), err
	}
	if s.nodeAuth == nil {
		return id, "", ca.Errorf(ca.KindPermissionDenied, "impersonation (%s) is off on this CA: it needs trusted node accounts (--trusted-node-accounts) and a Kubernetes API server to watch pods (--kubeconfig or in-cluster)", ImpersonatedIdentityKey)
	}
	switch uris := csr.URIs(); {
	case len(uris) != 1:
		return id, "", ca.Errorf(ca.KindInvalidArgument, "an impersonation CSR must carry exactly one URI SAN, the impersonated identity; it has %d", len(uris))
	case uris[0].String() != target.String():
		return id, "", ca.Errorf(ca.KindPermissionDenied, "impersonation refused: condition 4 (identity): the CSR asks for %q but %s names %s", clipInput(uris[0].String()), ImpersonatedIdentityKey, clipInput(target.String()))
	}
	if err := s.nodeAuth.Authorize(ctx, caller, target); err != nil {
		return id, "", err
	}
	return target, caller.String() + " impersonating, from pod " + caller.Namespace + "/" + caller.PodName, nil
}

// impersonatedIdentity reads ImpersonatedIdentity from the request
// metadata: ok is false when it is absent or empty (as Istio's clients
// send it when they do not impersonate); InvalidArgument when it is not a
// string, longer than MaxImpersonatedIdentity, not a SPIFFE ID, or when a
// key differs from it only in case.
func impersonatedIdentity(md *structpb.Struct) (spiffeid.ID, bool, error) {
	var v *structpb.Value
	for k, val := range md.GetFields() {
		switch {
		case k == ImpersonatedIdentityKey:
			v = val
		case strings.EqualFold(k, ImpersonatedIdentityKey):
			return spiffeid.ID{}, false, ca.Errorf(ca.KindInvalidArgument, "metadata key %q is not %s: keys are case-sensitive", k, ImpersonatedIdentityKey)
		}
	}
	if v == nil {
		return spiffeid.ID{}, false, nil
	}
	str, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return spiffeid.ID{}, false, ca.Errorf(ca.KindInvalidArgument, "metadata %s must be a string (a SPIFFE ID)", ImpersonatedIdentityKey)
	}
	raw := str.StringValue
	switch {
	case raw == "":
		return spiffeid.ID{}, false, nil
	case len(raw) > MaxImpersonatedIdentity:
		return spiffeid.ID{}, false, ca.Errorf(ca.KindInvalidArgument, "metadata %s is %d bytes, more than the %d-byte limit", ImpersonatedIdentityKey, len(raw), MaxImpersonatedIdentity)
	}
	target, err := spiffeid.FromString(raw)
	if err != nil {
		return spiffeid.ID{}, false, ca.Wrap(ca.KindInvalidArgument, err, fmt.Sprintf("metadata %s %q is not a SPIFFE ID", ImpersonatedIdentityKey, clipInput(raw)))
	}
	return target, true, nil
}

// clipInput shortens caller input quoted in a message or a log.
func clipInput(s string) string {
	const max = 128
	if len(s) <= max {
		return strings.ToValidUTF8(s, "?")
	}
	return strings.ToValidUTF8(s[:max], "?") + "..."
}

// requestTTL converts validity_duration (seconds; 0 = the default).
func requestTTL(secs int64) (time.Duration, error) {
	switch {
	case secs < 0:
		return 0, ca.Errorf(ca.KindInvalidArgument, "validity_duration must not be negative, got %d", secs)
	case secs > int64(math.MaxInt64/time.Second):
		return 0, ca.Errorf(ca.KindInvalidArgument, "validity_duration %d seconds is too long", secs)
	}
	return time.Duration(secs) * time.Second, nil
}

// credentialsFrom collects the bearer token from the "authorization"
// metadata and the client certificates from the TLS handshake.
func credentialsFrom(ctx context.Context) authn.Credentials {
	var c authn.Credentials
	// ValueFromIncomingContext copies only this key's values, where
	// FromIncomingContext copies the whole metadata (4-5 allocations per
	// request).
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if tok, ok := bearerToken(v); ok {
			c.Token = tok
			break
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.PeerCertificates = info.State.PeerCertificates
		}
	}
	return c
}

// bearerToken parses "Bearer <token>"; the scheme is case-insensitive
// (RFC 9110, section 11.1).
func bearerToken(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

func (s *Server) logFailure(ctx context.Context, err error, caller *authn.Caller, req *securityv1alpha1.IstioCertificateRequest) {
	code := Code(err)
	attrs := []any{"code", code.String(), "error", err}
	if caller != nil {
		attrs = append(attrs, "caller", caller.String())
	}
	if p, ok := peer.FromContext(ctx); ok {
		attrs = append(attrs, "peer", p.Addr.String())
	}
	if cluster := req.GetMetadata().GetFields()[ClusterIDKey].GetStringValue(); cluster != "" {
		attrs = append(attrs, "cluster_id", clipInput(cluster))
	}
	if imp := req.GetMetadata().GetFields()[ImpersonatedIdentityKey].GetStringValue(); imp != "" {
		attrs = append(attrs, "impersonated_identity", clipInput(imp))
	}
	switch ca.KindOf(err) {
	case ca.KindInternal, ca.KindUnavailable:
		s.log.Warn("certificate request failed", attrs...)
	case ca.KindResourceExhausted:
		s.log.Debug("certificate request rate limited", attrs...)
	default:
		s.log.Info("certificate request refused", attrs...)
	}
}

// pemCache keeps the PEM of the chain and roots of the last bundle signed
// with, since Authority.Sign returns the same certificates for every leaf
// of a bundle: only the leaf is encoded per request.
type pemCache struct {
	cur atomic.Pointer[pemEntry]
}

type pemEntry struct {
	chain, roots []*x509.Certificate
	chainPEM     []string
	rootsPEM     string
}

func (p *pemCache) chain(iss *ca.Issued) []string {
	e := p.cur.Load()
	if e == nil || !samePointers(e.chain, iss.Chain) || !samePointers(e.roots, iss.Roots) {
		e = &pemEntry{chain: iss.Chain, roots: iss.Roots, rootsPEM: string(certs.EncodeCertificates(iss.Roots...))}
		for _, c := range iss.Chain {
			e.chainPEM = append(e.chainPEM, string(certs.EncodeCertificates(c)))
		}
		p.cur.Store(e)
	}
	out := make([]string, 0, 2+len(e.chainPEM))
	out = append(out, certificatePEM(iss.Leaf.Raw))
	out = append(out, e.chainPEM...)
	return append(out, e.rootsPEM)
}

// certificatePEM encodes a DER certificate as a PEM string with one
// allocation; it produces exactly what pem.EncodeToMemory does, which
// needs a growing buffer and a copy into a string on this per-request path.
func certificatePEM(der []byte) string {
	const (
		begin = "-----BEGIN CERTIFICATE-----\n"
		end   = "-----END CERTIFICATE-----\n"
		line  = 48 // input bytes per 64-character line
	)
	enc := base64.StdEncoding
	n := enc.EncodedLen(len(der))
	var b strings.Builder
	b.Grow(len(begin) + n + (n+63)/64 + len(end))
	b.WriteString(begin)
	var buf [64]byte
	for len(der) > 0 {
		chunk := der[:min(line, len(der))]
		der = der[len(chunk):]
		enc.Encode(buf[:], chunk)
		b.Write(buf[:enc.EncodedLen(len(chunk))])
		b.WriteByte('\n')
	}
	b.WriteString(end)
	return b.String()
}

// samePointers reports whether a and b hold the very same certificates.
func samePointers(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
