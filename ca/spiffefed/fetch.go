package spiffefed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Refusal reasons of a fetch, the reason label of
// meshid_federation_bundle_refresh_failures_total.
const (
	ReasonFetch       = "fetch"        // connection, TLS (wrong SPIFFE ID, unknown root) or timeout
	ReasonStatus      = "status"       // an HTTP status other than 200
	ReasonRedirect    = "redirect"     // the endpoint redirected: never followed
	ReasonTooLarge    = "too_large"    // the body exceeds MaxBundleSize
	ReasonParse       = "parse"        // not a SPIFFE bundle
	ReasonTrustDomain = "trust_domain" // a bundle of another trust domain
	ReasonSequence    = "sequence"     // spiffe_sequence went backwards
	ReasonEmpty       = "empty"        // no key at all
)

// fetchError is a refused fetch with its reason.
type fetchError struct {
	reason string
	err    error
}

func (e *fetchError) Error() string { return e.err.Error() }
func (e *fetchError) Unwrap() error { return e.err }

func refuse(reason string, format string, args ...any) error {
	return &fetchError{reason: reason, err: fmt.Errorf(format, args...)}
}

// reasonOf returns the refusal reason of err.
func reasonOf(err error) string {
	var fe *fetchError
	if errors.As(err, &fe) {
		return fe.reason
	}
	return ReasonFetch
}

var errRedirect = errors.New("the bundle endpoint redirected; redirects are not followed")

// newClient returns the HTTP client of p: TLS per profile, no redirects,
// no connection reuse (every fetch is a new handshake, verified with the
// newest bundle), bounded response headers.
func newClient(p Peer, bundles x509bundle.Source, webRoots *x509.CertPool) *http.Client {
	tr := &http.Transport{
		Proxy:                  http.ProxyFromEnvironment,
		DisableKeepAlives:      true,
		TLSHandshakeTimeout:    10 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		ForceAttemptHTTP2:      false,
	}
	if p.Profile == ProfileSPIFFE {
		tr.TLSClientConfig = tlsconfig.TLSClientConfig(bundles, tlsconfig.AuthorizeID(p.EndpointID))
	} else {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: webRoots}
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect },
	}
}

// fetch GETs p's bundle and checks it against cur (nil before the first).
func fetch(ctx context.Context, c *http.Client, p Peer, cur *spiffebundle.Bundle, maxSize int64) (*spiffebundle.Bundle, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, http.NoBody)
	if err != nil {
		return nil, refuse(ReasonFetch, "%w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		if errors.Is(err, errRedirect) {
			return nil, refuse(ReasonRedirect, "%s: %w", p.URL, errRedirect)
		}
		return nil, refuse(ReasonFetch, "%w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, refuse(ReasonStatus, "%s answered HTTP %d", p.URL, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSize+1))
	if ctx.Err() != nil { // a slow drip: whatever arrived is cut short
		return nil, refuse(ReasonFetch, "the bundle did not arrive within the fetch timeout: %w", ctx.Err())
	}
	if err != nil {
		return nil, refuse(ReasonFetch, "reading the bundle: %w", err)
	}
	if int64(len(body)) > maxSize {
		return nil, refuse(ReasonTooLarge, "the bundle is larger than %d bytes", maxSize)
	}
	b, err := spiffebundle.Parse(p.TrustDomain, body)
	if err != nil {
		return nil, refuse(ReasonParse, "%w", err)
	}
	if err := checkBundle(b, cur); err != nil {
		return nil, err
	}
	if p.Profile == ProfileSPIFFE && p.EndpointID.MemberOf(p.TrustDomain) && resp.TLS != nil {
		// The endpoint's own SVID is of this trust domain: the new bundle
		// must verify it, or the next fetch could not, and the bundle is
		// most likely another trust domain's.
		if _, _, err := x509svid.Verify(resp.TLS.PeerCertificates, b.X509Bundle()); err != nil {
			return nil, refuse(ReasonTrustDomain, "the bundle does not verify the endpoint's own SVID (a bundle of another trust domain?): %w", err)
		}
	}
	return b, nil
}

// checkBundle refuses an empty bundle, one whose roots name another trust
// domain, and one whose sequence number is lower than cur's.
func checkBundle(b, cur *spiffebundle.Bundle) error {
	if len(b.X509Authorities()) == 0 && len(b.JWTAuthorities()) == 0 {
		return refuse(ReasonEmpty, "the bundle holds no key")
	}
	for _, c := range b.X509Authorities() {
		for _, u := range c.URIs {
			if id, err := spiffeid.FromURI(u); err == nil && id.TrustDomain() != b.TrustDomain() {
				return refuse(ReasonTrustDomain, "root %q is of trust domain %s, not %s", c.Subject.String(), id.TrustDomain(), b.TrustDomain())
			}
		}
	}
	if cur == nil {
		return nil
	}
	seq, ok := b.SequenceNumber()
	old, okOld := cur.SequenceNumber()
	if ok && okOld && seq < old {
		return refuse(ReasonSequence, "spiffe_sequence %d is lower than the %d already held", seq, old)
	}
	return nil
}
