package certservice_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/testkit"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// env is a running CA: authority, dev token issuer and gRPC server.
type env struct {
	authority *ca.Authority
	issuer    *devissuer.Issuer
	srv       *certservice.Server
	reg       *prometheus.Registry
	addr      string
	// stop ends Run and returns its error; the test's cleanup calls it
	// when the test has not.
	stop func() error
}

type envOpts struct {
	bundle *keystore.Bundle
	caCfg  func(*ca.Config)
	cfg    func(*certservice.Config)
	auths  func(e *env) []authn.Authenticator // default: JWT (dev issuer) then client cert
}

func selfSigned(t testing.TB) *keystore.Bundle {
	t.Helper()
	b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), KeyType: certs.ECP256})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	if o.bundle == nil {
		o.bundle = selfSigned(t)
	}
	quiet := slog.New(slog.DiscardHandler)
	e := &env{reg: prometheus.NewRegistry()}
	var err error
	caCfg := ca.Config{TrustDomain: td, Bundle: o.bundle, Logger: quiet}
	if o.caCfg != nil {
		o.caCfg(&caCfg)
	}
	e.authority, err = ca.New(caCfg)
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	if e.issuer, err = devissuer.New(key, ""); err != nil {
		t.Fatal(err)
	}
	var auths []authn.Authenticator
	if o.auths != nil {
		auths = o.auths(e)
	} else {
		j, err := authn.NewJWT(authn.JWTConfig{Issuer: e.issuer.Issuer(), JWKS: e.issuer.JWKS()})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := authn.NewClientCert(authn.ClientCertConfig{
			TrustDomain:   td,
			Roots:         func() []*x509.Certificate { return e.authority.Bundle().Roots },
			Intermediates: func() []*x509.Certificate { return chainOf(e.authority.Bundle()) },
		})
		if err != nil {
			t.Fatal(err)
		}
		auths = []authn.Authenticator{j, cc}
	}
	cfg := certservice.Config{
		Authority:     e.authority,
		Authenticator: authn.NewChain(auths...),
		Listen:        "127.0.0.1:0",
		ServingDNS:    []string{"meshid.istio-system.svc"},
		Logger:        quiet,
		Registerer:    e.reg,
	}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	if e.srv, err = certservice.New(cfg); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Listen(); err != nil {
		t.Fatal(err)
	}
	e.addr = e.srv.Addr().String()
	if e.srv.Ready() == nil {
		t.Fatal("Ready before Run")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Run(ctx) }()
	e.stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// Wait until Run serves: a first call succeeds only then (the
	// listener is bound already, so this does not race with Listen).
	e.waitReady(t)
	return e
}

func chainOf(b *keystore.Bundle) []*x509.Certificate {
	if b.Cert.CheckSignatureFrom(b.Cert) == nil && len(b.Intermediates) == 0 {
		return nil
	}
	return append([]*x509.Certificate{b.Cert}, b.Intermediates...)
}

func (e *env) pool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, r := range e.authority.Bundle().Roots {
		p.AddCert(r)
	}
	return p
}

// client dials the CA over TLS, verifying it with the roots for serverName.
// clientCert, when set, is presented in the handshake.
func (e *env) client(t testing.TB, serverName string, clientCert *tls.Certificate) securityv1alpha1.IstioCertificateServiceClient {
	t.Helper()
	cfg := &tls.Config{RootCAs: e.pool(), ServerName: serverName, MinVersion: tls.VersionTLS12}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(conn)
}

func (e *env) token(t testing.TB, ns, sa string) string {
	t.Helper()
	tok, err := e.issuer.Mint(ns, sa, []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func withToken(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func sid(ns, sa string) spiffeid.ID {
	return spiffeid.RequireFromSegments(td, "ns", ns, "sa", sa)
}

// csrFor returns a PEM CSR for id signed by key, shaped like istio-agent's
// (subject with one empty O, the SPIFFE ID as the only URI SAN).
func csrFor(t testing.TB, key crypto.Signer, id spiffeid.ID, mod func(*x509.CertificateRequest)) string {
	t.Helper()
	u, _ := url.Parse(id.String())
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{""}}, URIs: []*url.URL{u}}
	if mod != nil {
		mod(tmpl)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(certs.EncodeCSR(der))
}

func fakeClock() *clock.Fake { return clock.NewFake(time.Now()) }

var devissuerNew = devissuer.New

// srvAuth returns a JWT authenticator trusting e's dev issuer.
func (e *env) srvAuth(t testing.TB) authn.Authenticator {
	t.Helper()
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: e.issuer.Issuer(), JWKS: e.issuer.JWKS()})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// waitReady blocks until the server reports ready. Ready turns true right
// after Run starts serving; the TLS handshake of a first connection is
// answered only by a serving server, so it is the condition waited on.
func (e *env) waitReady(t testing.TB) {
	t.Helper()
	// The bound is a safety net only: a Run that returned without serving
	// leaves the listener bound, where a handshake waits forever.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: testkit.Guard}, "tcp", e.addr, &tls.Config{RootCAs: e.pool(), ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("handshake with the CA: %v", err)
	}
	defer conn.Close()
	// Leave no connection behind: it would hold a slot of the connection
	// limits until the server noticed it gone (TestConnectionLimits
	// flaked when it did). close_notify makes the server close its side,
	// after it has given the slot back (internal/connlimit). The server's
	// own close_notify comes before that, so the end to wait for is the
	// TCP connection's, below TLS.
	if err := conn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	raw := conn.NetConn()
	raw.SetReadDeadline(time.Now().Add(testkit.Guard)) // a safety bound only
	for _, r := range []io.Reader{conn, raw} {
		if _, err := io.Copy(io.Discard, r); err != nil && !isReset(err) {
			t.Fatalf("the CA did not close the readiness probe's connection: %v", err)
		}
	}
	if err := e.srv.Ready(); err != nil {
		t.Fatalf("serving but not ready: %v", err)
	}
}

// isReset reports a connection reset, how a server may close a connection
// it has not read to its end.
func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
