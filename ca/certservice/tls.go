package certservice

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// Names every serving certificate carries. Istio's agent replaces a CA
// address host containing "localhost" with istiod.istio-system.svc when it
// verifies the server, so both must be present for `CA_ADDR=localhost:...`.
var (
	baseDNSNames = []string{"localhost", "istiod.istio-system.svc"}
	baseIPs      = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
)

// servingCert is one issued serving certificate.
type servingCert struct {
	tls     *tls.Certificate
	issuer  *x509.Certificate // the CA certificate that signed it
	renewAt time.Time
}

// servingCerts issues the gRPC endpoint's TLS certificate from the CA and
// reissues it at half its life or when the CA's signing certificate
// changes. The private key lives only in memory.
type servingCerts struct {
	authority *ca.Authority
	dnsNames  []string
	ips       []net.IP
	ttl       time.Duration
	clock     clock.Clock

	cur atomic.Pointer[servingCert]
	mu  sync.Mutex // serializes reissuing
}

func newServingCerts(a *ca.Authority, extraDNS []string, listen string, ttl time.Duration, clk clock.Clock) *servingCerts {
	dns := slices.Clone(baseDNSNames)
	for _, n := range extraDNS {
		if n != "" && !slices.Contains(dns, n) {
			dns = append(dns, n)
		}
	}
	ips := slices.Clone(baseIPs)
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	return &servingCerts{authority: a, dnsNames: dns, ips: ips, ttl: ttl, clock: clk}
}

// get returns a current serving certificate, reissuing it when due. When
// reissuing fails but the old one is still valid, the old one is served.
func (s *servingCerts) get() (*tls.Certificate, error) {
	now := s.clock.Now()
	if c := s.cur.Load(); c != nil && s.fresh(c, now) {
		return c.tls, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cur.Load()
	if c != nil && s.fresh(c, now) {
		return c.tls, nil
	}
	next, err := s.issue(now)
	if err != nil {
		if c != nil && now.Before(c.tls.Leaf.NotAfter) {
			return c.tls, nil
		}
		return nil, err
	}
	s.cur.Store(next)
	return next.tls, nil
}

// ready reports whether a serving certificate valid at now is held.
func (s *servingCerts) ready(now time.Time) bool {
	c := s.cur.Load()
	return c != nil && now.Before(c.tls.Leaf.NotAfter)
}

func (s *servingCerts) fresh(c *servingCert, now time.Time) bool {
	return now.Before(c.renewAt) && c.issuer == s.authority.Bundle().Cert
}

func (s *servingCerts) issue(now time.Time) (*servingCert, error) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		return nil, fmt.Errorf("certservice: serving key: %w", err)
	}
	issuer := s.authority.Bundle().Cert
	iss, err := s.authority.IssueServing(key.Public(), s.dnsNames, s.ips, s.ttl)
	if err != nil {
		return nil, fmt.Errorf("certservice: issue serving certificate: %w", err)
	}
	chain := make([][]byte, 0, 1+len(iss.Chain))
	chain = append(chain, iss.Leaf.Raw)
	for _, c := range iss.Chain {
		chain = append(chain, c.Raw)
	}
	return &servingCert{
		tls:     &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: iss.Leaf},
		issuer:  issuer,
		renewAt: certs.RenewAt(iss.Leaf.NotBefore, iss.Leaf.NotAfter, 0.5, 0),
	}, nil
}

// tlsConfig is the server's TLS configuration. Client certificates are
// requested but not verified by TLS: the clientcert authenticator verifies
// them against the CA's current roots, so that a renewal by certificate
// works and a request with a token only is not refused at the handshake.
func (s *servingCerts) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.get()
		},
	}
}
