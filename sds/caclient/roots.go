package caclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync/atomic"
)

// rootPool holds the roots that verify the CA, replaceable while
// connections come and go.
type rootPool struct{ p atomic.Pointer[x509.CertPool] }

// SetRoots replaces the roots that verify the CA's serving certificate from
// the next TLS handshake on. The agent gives it the ROOTCA bundle, so that
// during a CA rotation the CA may serve with a certificate of its new root.
// An empty list is ignored: the client never trusts nothing.
//
// A connection waiting out gRPC's reconnect backoff (up to two minutes
// after repeated failures, e.g. handshakes refused because the CA already
// serves under a root this agent did not trust yet) is retried at once:
// the new roots may be what it was missing.
func (c *Client) SetRoots(roots []*x509.Certificate) {
	if len(roots) == 0 {
		return
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	c.roots.p.Store(pool)
	if c.conn != nil { // nil only while New runs
		c.conn.ResetConnectBackoff()
	}
}

// tlsConfig verifies the CA as crypto/tls would with RootCAs and
// ServerName, but against the pool current at each handshake: tls.Config
// cannot swap RootCAs once grpc holds it. InsecureSkipVerify only turns off
// the built-in check that VerifyConnection replaces; VerifyConnection runs
// on every handshake, resumed ones included. It verifies at the Client's
// clock's time, as Verify does the CA's answers.
func (c *Client) tlsConfig(serverName string) *tls.Config {
	roots, clk := c.roots, c.clock
	return &tls.Config{
		ServerName:         serverName,
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("caclient: the CA presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots:         roots.p.Load(),
				Intermediates: inter,
				CurrentTime:   clk.Now(),
				DNSName:       serverName,
				KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			return err
		},
	}
}
