package sdsserver_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

var (
	testTD = spiffeid.RequireTrustDomainFromString("cluster.local")
	testID = spiffeid.RequireFromPath(testTD, "/ns/default/sa/default")
)

// pki is a root CA created at run time. It is also the Signer of real
// secretcache.Managers, and counts their CSRs.
type pki struct {
	clock clock.Clock

	mu      sync.Mutex
	root    *x509.Certificate
	rootKey crypto.Signer

	csrs atomic.Int64 // Sign calls
}

func newPKI(t testing.TB, clk clock.Clock) *pki {
	t.Helper()
	p := &pki{clock: clock.OrReal(clk)}
	p.newRoot(t)
	return p
}

// newRoot replaces the root: later certificates chain to the new one.
func (p *pki) newRoot(t testing.TB) {
	t.Helper()
	root, key := testkit.Root(t, certs.CASpec{NotBefore: p.clock.Now().Add(-time.Hour), TTL: 10 * 365 * 24 * time.Hour, MaxPathLen: -1})
	p.mu.Lock()
	p.root, p.rootKey = root, key
	p.mu.Unlock()
}

func (p *pki) roots() []*x509.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []*x509.Certificate{p.root}
}

// issue signs a leaf for pub with the SPIFFE ID id.
func (p *pki) issue(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) (*x509.Certificate, error) {
	p.mu.Lock()
	root, key := p.root, p.rootKey
	p.mu.Unlock()
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, err
	}
	now := p.clock.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(ttl),
		URIs:         []*url.URL{id.URL()},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, pub, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// Sign implements secretcache.Signer: it signs the CSR's SPIFFE ID.
func (p *pki) Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	p.csrs.Add(1)
	if csr.CheckSignature() != nil || len(csr.URIs) != 1 {
		return nil, nil, status.Error(codes.InvalidArgument, "bad CSR")
	}
	id, err := spiffeid.FromURI(csr.URIs[0])
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, "bad SPIFFE ID")
	}
	leaf, err := p.issue(csr.PublicKey, id, ttl)
	if err != nil {
		return nil, nil, err
	}
	return []*x509.Certificate{leaf}, p.roots(), nil
}

// certSecret returns a fresh workload secret, valid for ttl.
func (p *pki) certSecret(t testing.TB, name string, ttl time.Duration) *secretcache.Secret {
	t.Helper()
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := p.issue(key.Public(), testID, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return &secretcache.Secret{
		Name: name, Version: leaf.SerialNumber.Text(16), Chain: []*x509.Certificate{leaf}, Key: key,
		TrustDomain: testTD, NotAfter: leaf.NotAfter,
	}
}

// rootSecret returns the current root bundle as a secret.
func (p *pki) rootSecret(name string) *secretcache.Secret {
	roots := p.roots()
	return &secretcache.Secret{
		Name: name, Version: roots[0].SerialNumber.Text(16), Roots: roots,
		TrustDomain: testTD, NotAfter: roots[0].NotAfter,
	}
}

// fakeSource is a Source over secrets the test sets. Names registered with
// pending are known but not ready; other names without a secret are
// unknown.
type fakeSource struct {
	mu       sync.Mutex
	secrets  map[string]*secretcache.Secret
	pendings map[string]bool
	watchers map[string]map[int]func(*secretcache.Secret)
	nextID   int
	fetches  map[string]int
	cancels  chan string // a name per cancelled watch
}

func newFakeSource() *fakeSource {
	return &fakeSource{
		secrets:  map[string]*secretcache.Secret{},
		pendings: map[string]bool{},
		watchers: map[string]map[int]func(*secretcache.Secret){},
		fetches:  map[string]int{},
		cancels:  make(chan string, 100000),
	}
}

func (f *fakeSource) Secret(ctx context.Context, name string) (*secretcache.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fetches[name]++
	if s := f.secrets[name]; s != nil {
		return s, nil
	}
	if f.pendings[name] {
		return nil, fmt.Errorf("%w: %s", secretcache.ErrNotReady, name)
	}
	return nil, fmt.Errorf("%w %q", secretcache.ErrUnknownResource, name)
}

func (f *fakeSource) Watch(name string, notify func(*secretcache.Secret)) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.nextID
	f.nextID++
	if f.watchers[name] == nil {
		f.watchers[name] = map[int]func(*secretcache.Secret){}
	}
	f.watchers[name][id] = notify
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			delete(f.watchers[name], id)
			f.mu.Unlock()
			f.cancels <- name
		})
	}
}

func (f *fakeSource) pending(name string) {
	f.mu.Lock()
	f.pendings[name] = true
	f.mu.Unlock()
}

// set installs s and notifies the watchers of its name.
func (f *fakeSource) set(s *secretcache.Secret) {
	f.mu.Lock()
	f.secrets[s.Name] = s
	var fns []func(*secretcache.Secret)
	for _, fn := range f.watchers[s.Name] {
		fns = append(fns, fn)
	}
	f.mu.Unlock()
	for _, fn := range fns {
		fn(s)
	}
}

func (f *fakeSource) watchCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watchers[name])
}

func (f *fakeSource) fetchCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fetches[name]
}

// env is a Source with the operations the protocol tests need. Every
// protocol test runs against a fake Source and a real secretcache.Manager.
type env struct {
	name string
	src  interface {
		Secret(context.Context, string) (*secretcache.Secret, error)
		Watch(string, func(*secretcache.Secret)) func()
	}
	// roots returns the CA's current roots.
	roots func() []*x509.Certificate
	// rotate makes a new version of default; rootChange a new ROOTCA (and,
	// with the Manager, a new default too).
	rotate     func(t *testing.T)
	rootChange func(t *testing.T)
	// later returns a name that does not exist yet, and a function that
	// makes it exist. With a Manager it is an absent file, which is
	// unknown until it appears (absent and not-allowed files look the
	// same), so a delta stream may report it removed first.
	later func(t *testing.T) (string, func())
	// watchers returns how many watches the server holds on name.
	watchers func(name string) int
}

func fakeEnv(t *testing.T) *env {
	p := newPKI(t, nil)
	f := newFakeSource()
	f.set(p.certSecret(t, secretcache.DefaultName, time.Hour))
	f.set(p.rootSecret(secretcache.RootName))
	n := 0
	return &env{
		name:   "fake",
		src:    f,
		roots:  p.roots,
		rotate: func(t *testing.T) { f.set(p.certSecret(t, secretcache.DefaultName, time.Hour)) },
		rootChange: func(t *testing.T) {
			p.newRoot(t)
			f.set(p.rootSecret(secretcache.RootName))
		},
		later: func(t *testing.T) (string, func()) {
			n++
			name := fmt.Sprintf("later-%d", n)
			f.pending(name)
			return name, func() { f.set(p.certSecret(t, name, time.Hour)) }
		},
		watchers: f.watchCount,
	}
}

func managerEnv(t *testing.T) *env {
	p := newPKI(t, nil)
	m := newManager(t, p, nil)
	dir := t.TempDir()
	n := 0
	return &env{
		name:  "manager",
		src:   m,
		roots: p.roots,
		rotate: func(t *testing.T) {
			if err := m.Rotate(context.Background()); err != nil {
				t.Fatal(err)
			}
		},
		rootChange: func(t *testing.T) {
			p.newRoot(t)
			if err := m.Rotate(context.Background()); err != nil {
				t.Fatal(err)
			}
		},
		later: func(t *testing.T) (string, func()) {
			n++
			path := filepath.Join(dir, fmt.Sprintf("later-%d.pem", n))
			return secretcache.FileRootPrefix + path, func() {
				if err := certs.WriteFileAtomic(path, certs.EncodeCertificates(p.roots()...), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		},
		watchers: m.Watchers,
	}
}

// newManager runs a real Manager whose Signer is p until the test ends.
func newManager(t testing.TB, p *pki, clk clock.Clock) *secretcache.Manager {
	t.Helper()
	m, stop := runManager(t, p, clk)
	t.Cleanup(stop)
	return m
}

// runManager runs a real Manager whose Signer is p until stop is called.
func runManager(t testing.TB, p *pki, clk clock.Clock) (*secretcache.Manager, func()) {
	t.Helper()
	m, err := secretcache.New(secretcache.Config{Signer: p, ID: testID, TTL: time.Hour, Clock: clk, FileSecretDirs: []string{os.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	return m, testkit.Start(t, "Manager", m.Run)
}
