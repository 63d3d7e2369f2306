package cfssl_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/ca/upstream/cfssl"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

func client(t *testing.T, c *testkit.CFSSL, profile, keyFile string) *cfssl.Client {
	t.Helper()
	u, err := upstream.ParseURL("cfssl+https://" + c.Addr + "?profile=" + profile + "&ca=" + c.TLSCAFile)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := cfssl.New(cfssl.Config{URL: u, CredentialsFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func csr(t *testing.T) ([]byte, any) {
	key := testkit.Key(t, certs.ECP256)
	der, err := certs.NewCSR(key, spiffeid.RequireFromString("spiffe://example.org"))
	if err != nil {
		t.Fatal(err)
	}
	return der, key.Public()
}

// TestMintAgainstRealCFSSL: the real cfssl serve signs an intermediate for
// our key under its root with the CA profile, and the answer passes Check;
// the leaf profile's answer (not a CA) and a wrong auth key do not.
func TestMintAgainstRealCFSSL(t *testing.T) {
	c := testkit.StartCFSSL(t, time.Hour)
	ctx := context.Background()

	der, pub := csr(t)
	m, err := client(t, c, testkit.CFSSLProfileCA, c.KeyFile).MintX509CA(ctx, der, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Roots) != 1 || !m.Roots[0].Equal(c.Root) || len(m.Chain) != 1 {
		t.Fatalf("roots %d (cfssl's: %v), chain %d", len(m.Roots), len(m.Roots) > 0 && m.Roots[0].Equal(c.Root), len(m.Chain))
	}
	if err := upstream.Check(m, pub, time.Now(), 30*time.Minute); err != nil {
		t.Fatalf("cfssl's CA answer refused: %v", err)
	}
	// The roots between mints (upstream.RootSource): the same as a mint's.
	var src upstream.RootSource = client(t, c, testkit.CFSSLProfileCA, c.KeyFile)
	roots, err := src.FetchRoots(ctx)
	if err != nil || len(roots) != 1 || !roots[0].Equal(c.Root) {
		t.Fatalf("FetchRoots: %d roots (cfssl's: %v), %v", len(roots), len(roots) > 0 && roots[0].Equal(c.Root), err)
	}
	if !m.Chain[0].IsCA || !m.Chain[0].MaxPathLenZero {
		t.Fatalf("not a CA of path length 0: IsCA %v", m.Chain[0].IsCA)
	}

	der, pub = csr(t)
	m, err = client(t, c, testkit.CFSSLProfileLeaf, c.KeyFile).MintX509CA(ctx, der, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := upstream.Check(m, pub, time.Now(), 30*time.Minute); !errors.Is(err, upstream.ErrRefused) || !strings.Contains(err.Error(), "not a CA") {
		t.Fatalf("a leaf from cfssl's leaf profile: %v, want refused as not a CA", err)
	}
	// Longer than cfssl's profile gives: refused as too short.
	der, pub = csr(t)
	m, err = client(t, c, testkit.CFSSLProfileCA, c.KeyFile).MintX509CA(ctx, der, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := upstream.Check(m, pub, time.Now(), 2*time.Hour); !errors.Is(err, upstream.ErrRefused) || !strings.Contains(err.Error(), "renewal period") {
		t.Fatalf("an intermediate of 1h for a 2h renewal period: %v, want refused", err)
	}

	wrong := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(wrong, []byte(strings.Repeat("ab", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := client(t, c, testkit.CFSSLProfileCA, wrong).MintX509CA(ctx, der, time.Hour); err == nil {
		t.Fatal("cfssl signed with a wrong auth key")
	} else if strings.Contains(err.Error(), strings.Repeat("ab", 32)) {
		t.Fatalf("the error quotes the key: %v", err)
	}
}

// TestNewRefuses: options and files are checked before any request.
func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte(strings.Repeat("0f", 16)), 0o600); err != nil {
		t.Fatal(err)
	}
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, []byte(strings.Repeat("0f", 16)), 0o644); err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]string{
		"cfssl+https://127.0.0.1:1?profile=p&bogus=1":   "unknown option",
		"cfssl+https://127.0.0.1:1":                     "profile option is required",
		"step+https://127.0.0.1:1?profile=p":            "want a cfssl+https",
		"cfssl+https://127.0.0.1:1?profile=p&ca=/nope":  "ca=/nope",
		"cfssl+https://127.0.0.1:1?profile=p&ca=" + key: "ca=",
	} {
		u, err := upstream.ParseURL(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if _, err := cfssl.New(cfssl.Config{URL: u, CredentialsFile: key}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
	u, _ := upstream.ParseURL("cfssl+https://127.0.0.1:1?profile=p")
	if _, err := cfssl.New(cfssl.Config{URL: u, CredentialsFile: loose}); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("a key file others may read: %v", err)
	}
	if _, err := cfssl.New(cfssl.Config{URL: u}); err == nil {
		t.Error("no credentials accepted")
	}
}
