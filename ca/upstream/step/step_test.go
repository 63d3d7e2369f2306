package step_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/ca/upstream/step"
	"github.com/meshid/meshid/testkit"
)

func client(t *testing.T, s *testkit.StepCA, provisioner, keyFile string) *step.Client {
	t.Helper()
	u, err := upstream.ParseURL("step+https://" + s.Addr + "?provisioner=" + provisioner + "&ca=" + s.RootFile)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := step.New(step.Config{URL: u, CredentialsFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// csr is the CSR upstream.Renewer sends: CN "meshid intermediate CA",
// O the trust domain, URI spiffe://example.org.
func csr(t *testing.T) ([]byte, any) {
	t.Helper()
	var got []byte
	var pub any
	r, err := upstream.NewRenewer(upstream.RenewerConfig{
		Upstream: authorityFunc(func(_ context.Context, der []byte, _ time.Duration) (*upstream.Minted, error) {
			got = der
			req, err := x509.ParseCertificateRequest(der)
			if err != nil {
				return nil, err
			}
			pub = req.PublicKey
			return nil, errors.New("only the CSR was wanted")
		}),
		TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = r.Mint(context.Background())
	if got == nil {
		t.Fatal("the renewer sent no CSR")
	}
	return got, pub
}

type authorityFunc func(context.Context, []byte, time.Duration) (*upstream.Minted, error)

func (f authorityFunc) MintX509CA(ctx context.Context, csr []byte, ttl time.Duration) (*upstream.Minted, error) {
	return f(ctx, csr, ttl)
}

// TestMintAgainstRealStepCA: the real step-ca signs the Renewer's CSR
// through the JWK provisioner with the intermediate template: a CA
// certificate of path length 0 for our key, name-constrained to the trust
// domain, under step-ca's intermediate, with step-ca's root as the roots,
// that Check accepts. The leaf provisioner's answer (not a CA), a
// lifetime above the provisioner's maximum, another provisioner's key and
// a provisioner that does not exist are refused, with step-ca's reason
// and no key in the error.
func TestMintAgainstRealStepCA(t *testing.T) {
	s := testkit.StartStepCA(t, 2*time.Hour, "example.org")
	ctx := context.Background()

	der, pub := csr(t)
	m, err := client(t, s, testkit.StepProvisionerCA, s.KeyFile).MintX509CA(ctx, der, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Roots) != 1 || !m.Roots[0].Equal(s.Root) || len(m.Chain) != 2 || !m.Chain[1].Equal(s.Intermediate) {
		t.Fatalf("roots %d (step-ca's: %v), chain %d", len(m.Roots), len(m.Roots) > 0 && m.Roots[0].Equal(s.Root), len(m.Chain))
	}
	if err := upstream.Check(m, pub, time.Now(), 30*time.Minute); err != nil {
		t.Fatalf("step-ca's CA answer refused: %v", err)
	}
	// The roots between mints (upstream.RootSource): the same as a mint's.
	var src upstream.RootSource = client(t, s, testkit.StepProvisionerCA, s.KeyFile)
	roots, err := src.FetchRoots(ctx)
	if err != nil || len(roots) != 1 || !roots[0].Equal(s.Root) {
		t.Fatalf("FetchRoots: %d roots (step-ca's: %v), %v", len(roots), len(roots) > 0 && roots[0].Equal(s.Root), err)
	}
	c := m.Chain[0]
	if !c.IsCA || !c.MaxPathLenZero || len(c.PermittedURIDomains) != 1 || c.PermittedURIDomains[0] != "example.org" || len(c.PermittedDNSDomains) != 2 ||
		c.Subject.CommonName != "meshid intermediate CA" || len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://example.org" {
		t.Fatalf("not the template's CA: IsCA %v pathlen0 %v URI domains %v subject %q URIs %v", c.IsCA, c.MaxPathLenZero, c.PermittedURIDomains, c.Subject, c.URIs)
	}
	if d := c.NotAfter.Sub(c.NotBefore); d < time.Hour || d > time.Hour+2*time.Minute {
		t.Fatalf("lifetime %v, asked 1h", d)
	}

	der, pub = csr(t)
	m, err = client(t, s, testkit.StepProvisionerLeaf, s.LeafKeyFile).MintX509CA(ctx, der, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := upstream.Check(m, pub, time.Now(), 30*time.Minute); !errors.Is(err, upstream.ErrRefused) || !strings.Contains(err.Error(), "not a CA") {
		t.Fatalf("a leaf from step's default template: %v, want refused as not a CA", err)
	}

	key, _ := os.ReadFile(s.KeyFile)
	var jwk map[string]any
	if err := json.Unmarshal(key, &jwk); err != nil {
		t.Fatal(err)
	}
	for what, tc := range map[string]struct {
		prov, key string
		ttl       time.Duration
		want      string
	}{
		"a lifetime above maxTLSCertDuration": {testkit.StepProvisionerCA, s.KeyFile, 3 * time.Hour, "HTTP 403"},
		"another provisioner's key":           {testkit.StepProvisionerCA, s.LeafKeyFile, time.Hour, "HTTP 401"},
		"no such provisioner":                 {"nope", s.KeyFile, time.Hour, "HTTP 401"},
	} {
		_, err := client(t, s, tc.prov, tc.key).MintX509CA(ctx, der, tc.ttl)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", what, err, tc.want)
		} else if strings.Contains(err.Error(), jwk["d"].(string)) || strings.Contains(err.Error(), "eyJ") {
			t.Errorf("%s: the error quotes the key or a token: %v", what, err)
		}
	}
}

// TestNewRefuses: options and the credentials file are checked before any
// request; no error quotes the file.
func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte, perm os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, perm); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key, pub := provisionerKey(t)
	good, _ := os.ReadFile(key)
	pubJSON, _ := json.Marshal(pub)
	rsaSmall, _ := json.Marshal(jose.JSONWebKey{Key: smallRSA(t)})
	for raw, want := range map[string]string{
		"step+https://127.0.0.1:1?provisioner=p&bogus=1":   "unknown option",
		"step+https://127.0.0.1:1":                         "provisioner option is required",
		"cfssl+https://127.0.0.1:1?provisioner=p":          "want a step+https",
		"step+https://127.0.0.1:1?provisioner=p&ca=/nope":  "ca=/nope",
		"step+https://127.0.0.1:1?provisioner=p&ca=" + key: "ca=",
	} {
		u, err := upstream.ParseURL(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if _, err := step.New(step.Config{URL: u, CredentialsFile: key}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
	u, _ := upstream.ParseURL("step+https://127.0.0.1:1?provisioner=p")
	for name, tc := range map[string]struct {
		data []byte
		perm os.FileMode
		want string
	}{
		"loose":     {good, 0o644, "mode"},
		"huge":      {append(good, make([]byte, upstream.MaxCredentialsSize)...), 0o600, "more than"},
		"public":    {pubJSON, 0o600, "not a private"},
		"garbage":   {[]byte("not json at all, secret-ish"), 0o600, "not a JSON Web Key"},
		"jwe":       {[]byte("eyJhbGciOiJQQkVTMi1IUzI1NitBMTI4S1ciLCJlbmMiOiJBMTI4R0NNIn0.a.b.c.d"), 0o600, "encrypted"},
		"jwe json":  {[]byte(`{"protected":"x","encrypted_key":"y","iv":"z","ciphertext":"secret-ish","tag":"t"}`), 0o600, "encrypted"},
		"small rsa": {rsaSmall, 0o600, "at least 2048"},
	} {
		f := write(name, tc.data, tc.perm)
		_, err := step.New(step.Config{URL: u, CredentialsFile: f})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		} else if strings.Contains(err.Error(), "secret-ish") {
			t.Errorf("%s: the error quotes the file: %v", name, err)
		}
	}
	if _, err := step.New(step.Config{URL: u}); err == nil {
		t.Error("no credentials accepted")
	}
	if _, err := step.New(step.Config{URL: u, CredentialsFile: key}); err != nil {
		t.Errorf("a private JWK of mode 0600: %v", err)
	}
}

func smallRSA(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
