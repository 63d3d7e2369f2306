package certservice_test

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/testkit"
)

// switchableSigner is a CA key whose signing can be turned off, as an HSM
// that is unreachable for a while.
type switchableSigner struct {
	crypto.Signer
	off atomic.Bool
}

func (s *switchableSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if s.off.Load() {
		return nil, errors.New("signing key unreachable")
	}
	return s.Signer.Sign(r, digest, opts)
}

// servingCert makes a TLS handshake with the CA for serverName, verifying
// its certificate at now (nil: the real time), and returns the
// certificate it served.
func (e *env) servingCert(t *testing.T, serverName string, now func() time.Time) (*x509.Certificate, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", e.addr, &tls.Config{RootCAs: e.pool(), ServerName: serverName, NextProtos: []string{"h2"}, Time: now})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// TestServingCertificateOutlivesAFailedReissue: when the serving
// certificate is due for reissue and the CA cannot sign (its key is
// unreachable), the CA keeps serving the one it has while it is valid;
// once that has expired, handshakes fail and Ready says so, until the key
// is back.
func TestServingCertificateOutlivesAFailedReissue(t *testing.T) {
	clk := fakeClock()
	b := selfSigned(t)
	key := &switchableSigner{Signer: b.Key}
	b.Key = key
	e := newEnv(t, envOpts{
		bundle: b,
		caCfg:  func(c *ca.Config) { c.Clock = clk },
		cfg:    func(c *certservice.Config) { c.Clock, c.ServingTTL = clk, 2*time.Hour },
	})
	first, err := e.servingCert(t, "localhost", clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	key.off.Store(true)
	clk.Set(first.NotAfter.Add(-time.Minute)) // past its reissue time, still valid
	got, err := e.servingCert(t, "localhost", clk.Now)
	if err != nil {
		t.Fatalf("handshake while reissuing fails and the certificate is valid: %v", err)
	}
	if got.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatal("another serving certificate served while the CA key is unreachable")
	}
	if err := e.srv.Ready(); err != nil {
		t.Fatalf("not ready with a valid serving certificate: %v", err)
	}
	// Expired by the CA's clock. The client verifies at the real time, at
	// which the old certificate is valid, so only the CA can refuse it.
	clk.Set(first.NotAfter.Add(time.Second))
	if _, err := e.servingCert(t, "localhost", nil); err == nil {
		t.Fatal("the CA served its expired serving certificate")
	}
	if err := e.srv.Ready(); err == nil {
		t.Fatal("ready with an expired serving certificate")
	}
	key.off.Store(false)
	got, err = e.servingCert(t, "localhost", clk.Now)
	if err != nil {
		t.Fatalf("handshake once the key is back: %v", err)
	}
	if got.SerialNumber.Cmp(first.SerialNumber) == 0 || !clk.Now().Before(got.NotAfter) {
		t.Fatal("no new serving certificate once the key is back")
	}
	if err := e.srv.Ready(); err != nil {
		t.Fatalf("not ready after the reissue: %v", err)
	}
}

// TestServingCertificateNamesListenIP: a CA listening on one address of
// the host has it as an IP SAN, so clients that dial the IP verify it;
// the unspecified address (listening on every interface) names nothing.
func TestServingCertificateNamesListenIP(t *testing.T) {
	ip := testkit.NonLoopbackIP()
	if ip == "" {
		testkit.SkipOrFail(t, "no non-loopback IPv4 address on this host")
	}
	e := newEnv(t, envOpts{cfg: func(c *certservice.Config) { c.Listen = net.JoinHostPort(ip, "0") }})
	if _, err := e.servingCert(t, ip, nil); err != nil {
		t.Fatalf("TLS to %s, the listen address: %v", ip, err)
	}

	all := newEnv(t, envOpts{cfg: func(c *certservice.Config) { c.Listen = "0.0.0.0:0" }})
	cert, err := all.servingCert(t, "localhost", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range cert.IPAddresses {
		if got.IsUnspecified() {
			t.Fatalf("the serving certificate names %s", got)
		}
	}
	if len(cert.IPAddresses) != 2 {
		t.Fatalf("IP SANs %v, want 127.0.0.1 and ::1", cert.IPAddresses)
	}
}
