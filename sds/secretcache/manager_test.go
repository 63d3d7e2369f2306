package secretcache_test

import (
	"context"
	"crypto/x509"
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

func TestNewValidates(t *testing.T) {
	ca := newTestCA(t, nil)
	tests := []struct {
		name string
		cfg  secretcache.Config
	}{
		{"no signer", secretcache.Config{ID: testID}},
		{"no id", secretcache.Config{Signer: ca}},
		{"bad key type", secretcache.Config{Signer: ca, ID: testID, KeyType: "dsa-1024"}},
		{"ed25519 not offered to workloads", secretcache.Config{Signer: ca, ID: testID, KeyType: certs.Ed25519}},
		{"negative ttl", secretcache.Config{Signer: ca, ID: testID, TTL: -time.Second}},
		{"grace above 1", secretcache.Config{Signer: ca, ID: testID, GraceRatio: 1.5}},
		{"huge jitter", secretcache.Config{Signer: ca, ID: testID, Jitter: 0.6}},
		{"jitter at the limit", secretcache.Config{Signer: ca, ID: testID, Jitter: 0.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := secretcache.New(tc.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
	// The edges that are valid: renewal at expiry, jitter just under 0.5.
	for _, cfg := range []secretcache.Config{
		{Signer: ca, ID: testID, GraceRatio: 1},
		{Signer: ca, ID: testID, Jitter: 0.49},
	} {
		if _, err := secretcache.New(cfg); err != nil {
			t.Errorf("New(GraceRatio %v, Jitter %v): %v", cfg.GraceRatio, cfg.Jitter, err)
		}
	}
}

func TestDefaultAndRootsByKeyType(t *testing.T) {
	tests := []struct {
		keyType certs.KeyType
		want    string
	}{
		{"", "ec-p256"},
		{certs.ECP256, "ec-p256"},
		{certs.ECP384, "ec-p384"},
		{certs.RSA2048, "rsa-2048"},
		{certs.RSA3072, "rsa-3072"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			f := newFixture(t, func(c *secretcache.Config) { c.KeyType = tc.keyType; c.TTL = time.Hour })
			s := mustSecret(t, f.m, secretcache.DefaultName)
			if got := certs.KeyTypeOf(s.Key.Public()); got != tc.want {
				t.Errorf("key type %s, want %s", got, tc.want)
			}
			// The CSR carries exactly the SPIFFE URI SAN.
			csr := f.ca.csr()
			if len(csr.URIs) != 1 || csr.URIs[0].String() != testID.String() ||
				len(csr.DNSNames)+len(csr.EmailAddresses)+len(csr.IPAddresses) != 0 {
				t.Errorf("CSR SANs: uris=%v dns=%v email=%v ip=%v", csr.URIs, csr.DNSNames, csr.EmailAddresses, csr.IPAddresses)
			}
			if !certs.KeyMatches(s.Chain[0].PublicKey, s.Key) {
				t.Error("leaf does not hold the key")
			}
			if s.Name != secretcache.DefaultName || s.TrustDomain != testTD || s.Version == "" || s.Roots != nil {
				t.Errorf("secret fields: %+v", s)
			}
			if want := f.clock.Now().Add(time.Hour); !s.NotAfter.Equal(want) {
				t.Errorf("NotAfter %v, want %v (TTL passed to the CA)", s.NotAfter, want)
			}
			id, _, err := x509svid.Verify(s.Chain, x509bundle.FromX509Authorities(testTD, []*x509.Certificate{f.ca.currentRoot()}), x509svid.WithTime(f.clock.Now()))
			if err != nil || id != testID {
				t.Errorf("verify: id=%v err=%v", id, err)
			}
			r := mustSecret(t, f.m, secretcache.RootName)
			if len(r.Roots) != 1 || !r.Roots[0].Equal(f.ca.currentRoot()) || r.Chain != nil || r.Key != nil || r.Name != secretcache.RootName {
				t.Errorf("ROOTCA: %+v", r)
			}
			// Cached: same secret, no second CSR.
			if again := mustSecret(t, f.m, secretcache.DefaultName); again != s {
				t.Error("second request not served from the cache")
			}
			if n := f.ca.calls.Load(); n != 1 {
				t.Errorf("%d CSRs, want 1", n)
			}
			if err := f.m.Ready(); err != nil {
				t.Errorf("Ready: %v", err)
			}
			if got, want := testkit.Metric(t, f.reg, "meshid_agent_cert_expiry_seconds"), time.Hour.Seconds(); got != want {
				t.Errorf("expiry gauge %v, want %v", got, want)
			}
		})
	}
}

func TestRootRequestObtainsCertificate(t *testing.T) {
	f := newFixture(t, nil)
	if err := f.m.Ready(); !isNotReady(err) {
		t.Fatalf("Ready before any certificate: %v", err)
	}
	// Before the first certificate the expiry gauge is NaN, never 0 (an
	// alert "expires within an hour" would fire on every new agent).
	if g := testkit.Metric(t, f.reg, "meshid_agent_cert_expiry_seconds"); !math.IsNaN(g) {
		t.Errorf("expiry gauge before the first certificate = %v, want NaN", g)
	}
	r := mustSecret(t, f.m, secretcache.RootName)
	if !r.Roots[0].Equal(f.ca.currentRoot()) {
		t.Fatal("wrong roots")
	}
	mustSecret(t, f.m, secretcache.DefaultName)
	if n := f.ca.calls.Load(); n != 1 {
		t.Fatalf("%d CSRs for ROOTCA then default, want 1", n)
	}
}

func TestSingleFlight(t *testing.T) {
	f := newFixture(t, nil)
	gate := make(chan struct{})
	f.ca.gate = gate
	const n = 1000
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		versions = make([]string, n)
		errs     = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			name := secretcache.DefaultName
			if i%10 == 0 {
				name = secretcache.RootName
			}
			s, err := f.m.Secret(context.Background(), name)
			errs[i] = err
			if err == nil && name == secretcache.DefaultName {
				versions[i] = s.Version
			}
		}()
	}
	close(start)
	<-f.ca.entered // the one CSR reached the CA; hold it there while the rest pile up
	for range 100 {
		runtime.Gosched()
	}
	close(gate)
	wg.Wait()
	if got := f.ca.calls.Load(); got != 1 {
		t.Fatalf("%d CSRs for %d concurrent requests, want exactly 1", got, n)
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if versions[i] != "" && versions[i] != versions[1] {
			t.Fatalf("request %d got version %s, request 1 got %s", i, versions[i], versions[1])
		}
	}
}

func TestCallerCancelDoesNotAbortSharedCSR(t *testing.T) {
	f := newFixture(t, nil)
	gate := make(chan struct{})
	f.ca.gate = gate
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, err := f.m.Secret(ctx, secretcache.DefaultName); first <- err }()
	<-f.ca.entered
	second := make(chan *secretcache.Secret, 1)
	go func() { s, _ := f.m.Secret(context.Background(), secretcache.DefaultName); second <- s }()
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
	close(gate)
	if s := <-second; s == nil {
		t.Fatal("the other caller got nothing after the first one gave up")
	}
	if n := f.ca.calls.Load(); n != 1 {
		t.Fatalf("%d CSRs, want 1", n)
	}
}

func TestUnknownResource(t *testing.T) {
	f := newFixture(t, nil)
	for _, name := range []string{"", "foo", "Default", "rootca", "file-cert:", "file-cert:/a", "file-cert:/a~", "file-cert:~/b", "file-cert:/a~/b~/c", "file-root:"} {
		t.Run(name, func(t *testing.T) {
			if _, err := f.m.Secret(context.Background(), name); !errors.Is(err, secretcache.ErrUnknownResource) {
				t.Fatalf("Secret(%q) = %v, want ErrUnknownResource", name, err)
			}
			cancel := f.m.Watch(name, func(*secretcache.Secret) {})
			cancel()
			if n := f.m.Watchers(name); n != 0 {
				t.Fatalf("%d watchers for an unknown name", n)
			}
		})
	}
	if n := f.ca.calls.Load(); n != 0 {
		t.Fatalf("%d CSRs for unknown names", n)
	}
}

func TestInvalidResponsesRejected(t *testing.T) {
	tests := []struct{ mode, want string }{
		{"other-key", "key"},
		{"other-id", "identity"},
		{"other-issuer", "verify"},
		{"expired", "verify"},
		{"no-roots", "no roots"},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			f := newFixture(t, nil)
			f.ca.setTamper(tc.mode)
			_, err := f.m.Secret(context.Background(), secretcache.DefaultName)
			if !isNotReady(err) {
				t.Fatalf("Secret = %v, want ErrNotReady", err)
			}
			if !containsFold(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			if got := testkit.Metric(t, f.reg, "meshid_agent_rotation_failures_total", "code", "invalid_response"); got != 1 {
				t.Errorf("invalid_response failures = %v, want 1", got)
			}
			if f.m.Ready() == nil {
				t.Error("Ready after a refused answer")
			}
		})
	}
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

func TestIdentityInOtherTrustDomainRejected(t *testing.T) {
	// The CA answers for a different trust domain than the one we asked:
	// go-spiffe finds no bundle for it and the answer is refused.
	f := newFixture(t, func(c *secretcache.Config) {
		c.ID = spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("example.org"), "/ns/default/sa/default")
	})
	f.ca.setTamper("other-id")
	if _, err := f.m.Secret(context.Background(), secretcache.DefaultName); !isNotReady(err) {
		t.Fatalf("Secret = %v, want ErrNotReady", err)
	}
}

func TestCodesPreserved(t *testing.T) {
	f := newFixture(t, nil)
	f.ca.setFail(codes.PermissionDenied)
	_, err := f.m.Secret(context.Background(), secretcache.DefaultName)
	if !isNotReady(err) || status.Code(err) != codes.PermissionDenied {
		t.Fatalf("err %v (code %v), want ErrNotReady with PermissionDenied", err, status.Code(err))
	}
	// A forced rotation during the backoff reports the same code without
	// another CA call.
	if err := f.m.Rotate(context.Background()); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Rotate: %v", err)
	}
	if got := testkit.Metric(t, f.reg, "meshid_agent_rotation_failures_total", "code", "PermissionDenied"); got != 1 {
		t.Fatalf("PermissionDenied failures = %v, want 1", got)
	}
}
