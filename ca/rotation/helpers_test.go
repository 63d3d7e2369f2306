package rotation_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

var (
	t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	td = spiffeid.RequireTrustDomainFromString("cluster.local")
)

const (
	propagation = 10 * time.Minute
	retireAfter = 2 * time.Hour
)

// root is a self-signed root and its key.
type root struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newRoot(t *testing.T, cn string, notBefore time.Time, ttl time.Duration) root {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	c, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: cn}, Key: key, NotBefore: notBefore, TTL: ttl, MaxPathLen: -1})
	if err != nil {
		t.Fatal(err)
	}
	return root{c, key}
}

// intermediate returns a plugged CA: an intermediate of r, trusting roots
// (r's root when none is given).
func (r root) intermediate(t *testing.T, cn string, roots ...*x509.Certificate) *keystore.Bundle {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	c, err := certs.NewIntermediateCA(certs.CASpec{Subject: pkix.Name{CommonName: cn}, Key: key, NotBefore: t0.Add(-time.Hour), TTL: 5 * 365 * 24 * time.Hour, MaxPathLen: 0}, r.cert, r.key)
	if err != nil {
		t.Fatal(err)
	}
	if len(roots) == 0 {
		roots = []*x509.Certificate{r.cert}
	}
	return &keystore.Bundle{Cert: c, Key: key, Roots: roots}
}

// world is a real authority driven by a Manager on a fake clock.
type world struct {
	clk  *clock.Fake
	auth *ca.Authority
	rot  *rotation.Manager
	reg  *prometheus.Registry
}

func newWorld(t *testing.T, initial *keystore.Bundle, mod func(*rotation.Config)) *world {
	t.Helper()
	w := &world{clk: clock.NewFake(t0), reg: prometheus.NewRegistry()}
	var err error
	w.auth, err = ca.New(ca.Config{TrustDomain: td, Bundle: initial, Clock: w.clk, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rotation.Config{
		Current: initial, Target: w.auth, Check: w.auth.Check,
		Propagation: propagation, RetireAfter: retireAfter,
		Clock: w.clk, Registerer: w.reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	if w.rot, err = rotation.New(cfg); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "rotation", w.rot.Run)
	return w
}

// parked waits until Run waits on the clock and returns its deadline.
func (w *world) parked(t *testing.T) time.Time {
	t.Helper()
	stop := make(chan struct{})
	timer := time.AfterFunc(testkit.Guard, func() { close(stop) })
	defer timer.Stop()
	if !w.clk.WaitForWaiters(1, stop) {
		t.Fatal("Run did not wait on the clock")
	}
	d, _ := w.clk.NextDeadline()
	return d
}

// waitPhase waits until the rotation reaches p.
func (w *world) waitPhase(t *testing.T, p rotation.Phase) rotation.Status {
	t.Helper()
	return w.waitFor(t, "phase "+p.String(), func(st rotation.Status) bool { return st.Phase == p })
}

// waitFor waits, on the rotation's Changed signal, until its Status
// satisfies cond, failing t after Guard.
func (w *world) waitFor(t *testing.T, what string, cond func(rotation.Status) bool) rotation.Status {
	t.Helper()
	guard := time.NewTimer(testkit.Guard)
	defer guard.Stop()
	for {
		changed := w.rot.Changed()
		st := w.rot.Status()
		if cond(st) {
			return st
		}
		select {
		case <-changed:
		case <-guard.C:
			t.Fatalf("not within %v: %s (phase %v, stuck %q)", testkit.Guard, what, st.Phase, st.Stuck)
		}
	}
}

// leaf signs a leaf with the authority and returns it with its chain.
func (w *world) leaf(t *testing.T) *ca.Issued {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	id := spiffeid.RequireFromPath(td, "/ns/default/sa/default")
	csr, err := ca.ParseCSR(testkit.CSRPEM(t, key, id))
	if err != nil {
		t.Fatal(err)
	}
	iss, err := w.auth.Sign(context.Background(), ca.Request{CSR: csr, ID: id, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// issuedBy reports whether the leaf was signed by the CA certificate c.
func issuedBy(iss *ca.Issued, c *x509.Certificate) bool {
	return iss.Leaf.CheckSignatureFrom(c) == nil
}

func subjects(cs []*x509.Certificate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Subject.CommonName
	}
	return out
}

// notCA is an end-entity certificate of r, with a key, posing as a CA.
func (r root) notCA(t *testing.T) *keystore.Bundle {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	c := testkit.Certificate(t, &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not a CA"},
		NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(time.Hour * 24),
		BasicConstraintsValid: true, IsCA: false,
	}, r.cert, key.Public(), r.key)
	return &keystore.Bundle{Cert: c, Key: key, Roots: []*x509.Certificate{r.cert}}
}

// writeCADir writes b in Istio's cacerts layout.
func writeCADir(t *testing.T, dir string, b *keystore.Bundle) {
	t.Helper()
	chain := append([]*x509.Certificate{b.Cert}, b.Intermediates...)
	for name, data := range map[string][]byte{
		keystore.CACertFile:    certs.EncodeCertificates(b.Cert),
		keystore.CertChainFile: certs.EncodeCertificates(chain...),
		keystore.RootCertFile:  certs.EncodeCertificates(b.Roots...),
	} {
		if err := certs.WriteFileAtomic(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeKey(t, dir, b.Key)
}

func writeKey(t *testing.T, dir string, key crypto.Signer) {
	t.Helper()
	pem, err := certs.EncodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFileAtomic(filepath.Join(dir, keystore.CAKeyFile), pem, 0o600); err != nil {
		t.Fatal(err)
	}
}
