package secretcache_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

var (
	testTD = spiffeid.RequireTrustDomainFromString("cluster.local")
	testID = spiffeid.RequireFromPath(testTD, "/ns/default/sa/default")
	epoch  = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
)

// testCA is a real signer: it checks the CSR's signature and issues a leaf
// with crypto/x509 under a CA created at run time. Its knobs make it fail,
// block, or misbehave the ways a broken CA could.
type testCA struct {
	clock clock.Clock

	mu       sync.Mutex
	root     *x509.Certificate
	rootKey  crypto.Signer
	failCode codes.Code    // codes.OK = sign
	tamper   string        // "", "other-key", "other-id", "other-issuer", "expired", "no-roots"
	gate     chan struct{} // when set, Sign waits for it to close
	lastCSR  *x509.CertificateRequest

	calls   atomic.Int64
	entered chan struct{} // receives one value per Sign call (buffered)
}

func newTestCA(t testing.TB, clk clock.Clock) *testCA {
	t.Helper()
	ca := &testCA{clock: clock.OrReal(clk), entered: make(chan struct{}, 10000)}
	ca.newRoot(t)
	return ca
}

// newRoot replaces the CA with a fresh root, as a root rotation would.
func (ca *testCA) newRoot(t testing.TB) *x509.Certificate {
	t.Helper()
	root, key := testkit.Root(t, certs.CASpec{NotBefore: ca.clock.Now().Add(-time.Hour), TTL: 10 * 365 * 24 * time.Hour, MaxPathLen: -1})
	ca.mu.Lock()
	ca.root, ca.rootKey = root, key
	ca.mu.Unlock()
	return root
}

func (ca *testCA) setFail(c codes.Code) {
	ca.mu.Lock()
	ca.failCode = c
	ca.mu.Unlock()
}

// Sign signs like a CA and then checks its own answer with caclient.Verify,
// as the agent's CA client does, so that a tampered answer reaches the
// Manager as the refusal caclient would return.
func (ca *testCA) Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	ca.calls.Add(1)
	// The outcome is decided on entry, so a test that changes the knobs
	// after seeing the call enter does not change this call.
	ca.mu.Lock()
	gate, failCode := ca.gate, ca.failCode
	ca.mu.Unlock()
	ca.entered <- struct{}{}
	if gate != nil {
		<-gate
	}
	if failCode != codes.OK {
		return nil, nil, status.Error(failCode, "test CA is failing")
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if err := csr.CheckSignature(); err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ca.lastCSR = csr
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, nil, err
	}
	now := ca.clock.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now,
		NotAfter:     now.Add(ttl),
		URIs:         csr.URIs,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	pub, signer, issuer, roots := csr.PublicKey, ca.rootKey, ca.root, []*x509.Certificate{ca.root}
	switch ca.tamper {
	case "other-key":
		k, _ := certs.GenerateKey(certs.ECP256)
		pub = k.Public()
	case "other-id":
		tmpl.URIs = []*url.URL{spiffeid.RequireFromPath(testTD, "/ns/default/sa/other").URL()}
	case "other-issuer":
		k, _ := certs.GenerateKey(certs.ECP256)
		other, err := certs.NewRootCA(certs.CASpec{Key: k, NotBefore: now.Add(-time.Hour), TTL: 24 * time.Hour})
		if err != nil {
			return nil, nil, err
		}
		signer, issuer = k, other
	case "expired":
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-2*time.Hour), now.Add(-time.Hour)
	case "backdated":
		tmpl.NotBefore = now.Add(-10 * time.Hour)
	case "one-second":
		// Renewal at half its life, 0.5s from now: inside the backoff floor.
		tmpl.NotBefore, tmpl.NotAfter = now, now.Add(time.Second)
	case "no-roots":
		roots = nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, pub, signer)
	if err != nil {
		return nil, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	id, err := x509svid.IDFromCert(&x509.Certificate{URIs: csr.URIs})
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := caclient.Verify([]*x509.Certificate{leaf}, roots, csr.PublicKey, id, now); err != nil {
		return nil, nil, err
	}
	return []*x509.Certificate{leaf}, roots, nil
}

func (ca *testCA) currentRoot() *x509.Certificate {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.root
}

func (ca *testCA) csr() *x509.CertificateRequest {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.lastCSR
}

type fixture struct {
	clock *clock.Fake
	ca    *testCA
	reg   *prometheus.Registry
	logs  *testkit.LogRecorder
	m     *secretcache.Manager
}

func newFixture(t *testing.T, mod func(*secretcache.Config)) *fixture {
	t.Helper()
	f := &fixture{clock: clock.NewFake(epoch), reg: prometheus.NewRegistry(), logs: testkit.NewLogRecorder()}
	f.ca = newTestCA(t, f.clock)
	cfg := secretcache.Config{
		Signer: f.ca,
		ID:     testID,
		// Tests write their files under t.TempDir().
		FileSecretDirs: []string{os.TempDir()},
		Clock:          f.clock,
		Logger:         slog.New(f.logs),
		Registerer:     f.reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := secretcache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.m = m
	return f
}

// run starts Run and stops it at the end of the test.
func (f *fixture) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Run did not return")
		}
	})
}

// parked waits until the scheduler parked on a timer and returns its
// deadline.
func (f *fixture) parked(t *testing.T) time.Time {
	t.Helper()
	return testkit.NextDeadline(t, f.clock, "the scheduler's timer")
}

// watch registers a watcher that forwards to a channel.
func watch(t *testing.T, m *secretcache.Manager, name string) <-chan *secretcache.Secret {
	t.Helper()
	ch := make(chan *secretcache.Secret, 100)
	cancel := m.Watch(name, func(s *secretcache.Secret) {
		select {
		case ch <- s:
		default:
			panic("watch channel full")
		}
	})
	t.Cleanup(cancel)
	return ch
}

func receive(t *testing.T, ch <-chan *secretcache.Secret, what string) *secretcache.Secret {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(20 * time.Second):
		t.Fatalf("no notification for %s", what)
		return nil
	}
}

func mustSecret(t *testing.T, m *secretcache.Manager, name string) *secretcache.Secret {
	t.Helper()
	s, err := m.Secret(context.Background(), name)
	if err != nil {
		t.Fatalf("Secret(%q): %v", name, err)
	}
	return s
}

func isNotReady(err error) bool { return errors.Is(err, secretcache.ErrNotReady) }

func (ca *testCA) setTamper(mode string) {
	ca.mu.Lock()
	ca.tamper = mode
	ca.mu.Unlock()
}
