package catool_test

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/catool"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func root(t *testing.T, cfg catool.RootConfig) (*x509.Certificate, string) {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(t.TempDir(), "root")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.NewFake(t0)
	}
	c, err := catool.Root(cfg)
	if err != nil {
		t.Fatalf("Root: %v", err)
	}
	return c, cfg.Dir
}

// TestRootByCfssl: the root cfssl signs has the CA profile's usages,
// unlimited path length, a 20-byte positive serial (cfssl's rule), a
// subject key ID, and the window of the injected clock.
func TestRootByCfssl(t *testing.T) {
	for _, kt := range certs.CAKeyTypes {
		t.Run(string(kt), func(t *testing.T) {
			if testing.Short() && strings.HasPrefix(string(kt), "rsa-") && kt != certs.RSA2048 {
				t.Skip("slow RSA key generation")
			}
			var report bytes.Buffer
			c, dir := root(t, catool.RootConfig{KeyType: kt, Org: "Acme", CN: "Acme Root", Report: &report})
			if !c.IsCA || c.MaxPathLen != -1 || c.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign|x509.KeyUsageDigitalSignature {
				t.Errorf("CA %t pathlen %d usage %b", c.IsCA, c.MaxPathLen, c.KeyUsage)
			}
			if c.SerialNumber.Sign() <= 0 || c.SerialNumber.BitLen() > 159 || len(c.SubjectKeyId) == 0 {
				t.Errorf("serial %x, SKI %x", c.SerialNumber, c.SubjectKeyId)
			}
			if !c.NotBefore.Equal(t0.Add(-catool.Backdate)) || !c.NotAfter.Equal(t0.Add(-catool.Backdate+catool.DefaultCATTL)) {
				t.Errorf("valid %v to %v", c.NotBefore, c.NotAfter)
			}
			if c.Subject.String() != "CN=Acme Root,O=Acme" || certs.KeyTypeOf(c.PublicKey) != string(kt) {
				t.Errorf("subject %q key %s", c.Subject, certs.KeyTypeOf(c.PublicKey))
			}
			if err := c.CheckSignatureFrom(c); err != nil {
				t.Errorf("not self-signed: %v", err)
			}
			if m := testkit.FilePerm(t, filepath.Join(dir, catool.RootKeyFile)); m != 0o600 {
				t.Errorf("key mode %o", m)
			}
			if !strings.Contains(report.String(), catool.RootKeyFile) {
				t.Errorf("report %q", report.String())
			}
		})
	}
}

func TestRootRefusals(t *testing.T) {
	_, dir := root(t, catool.RootConfig{})
	key, _ := os.ReadFile(filepath.Join(dir, catool.RootKeyFile))
	for name, cfg := range map[string]catool.RootConfig{
		"key exists": {Dir: dir},
		"ed25519":    {Dir: t.TempDir(), KeyType: certs.Ed25519},
		"no dir":     {},
		"negative":   {Dir: t.TempDir(), TTL: -time.Hour},
	} {
		if _, err := catool.Root(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, catool.RootKeyFile)); !bytes.Equal(b, key) {
		t.Fatal("root key replaced without Force")
	}
	if _, err := catool.Root(catool.RootConfig{Dir: dir, Force: true}); err != nil {
		t.Fatal(err)
	}
}

// TestIntermediateByCfssl: cfssl's local signer under the CA profile makes
// a pathlen-0 intermediate signed by the root, whose directory loads as a
// CA.
func TestIntermediateByCfssl(t *testing.T) {
	r, rootDir := root(t, catool.RootConfig{TTL: 365 * 24 * time.Hour, Org: "Acme"})
	fake := clock.NewFake(t0.Add(time.Hour))
	dir := filepath.Join(t.TempDir(), "west")
	inter, err := catool.Intermediate(catool.IntermediateConfig{RootDir: rootDir, Dir: dir, Name: "west", KeyType: certs.ECP384, CN: "I", Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	if !inter.IsCA || inter.MaxPathLen != 0 || !inter.MaxPathLenZero || inter.Subject.String() != "CN=I,O=Acme,L=west" {
		t.Errorf("CA %t pathlen %d zero %t subject %q", inter.IsCA, inter.MaxPathLen, inter.MaxPathLenZero, inter.Subject)
	}
	if err := inter.CheckSignatureFrom(r); err != nil || !bytes.Equal(inter.AuthorityKeyId, r.SubjectKeyId) {
		t.Errorf("not signed by the root: %v", err)
	}
	if !inter.NotAfter.Equal(r.NotAfter) || !inter.NotBefore.Equal(t0.Add(time.Hour-catool.Backdate)) {
		t.Errorf("window %v to %v; root ends %v", inter.NotBefore, inter.NotAfter, r.NotAfter)
	}
	b, err := keystore.LoadDir(dir, fake.Now())
	if err != nil || !b.Cert.Equal(inter) {
		t.Fatalf("LoadDir: %v", err)
	}
	if m := testkit.FilePerm(t, filepath.Join(dir, catool.CAKeyFile)); m != 0o600 {
		t.Errorf("key mode %o", m)
	}

	// A root with pathlen 0 cannot sign an intermediate; an explicit TTL
	// past the root is refused unless AllowOutlive; the key is kept.
	if _, err := catool.Intermediate(catool.IntermediateConfig{RootDir: dir + "-nope", Dir: t.TempDir(), Name: "x", Clock: fake}); err == nil {
		t.Error("missing root dir accepted")
	}
	long := catool.IntermediateConfig{RootDir: rootDir, Dir: t.TempDir(), Name: "long", TTL: 400 * 24 * time.Hour, Clock: fake}
	if _, err := catool.Intermediate(long); err == nil || !strings.Contains(err.Error(), "--allow-outlive") {
		t.Errorf("outliving TTL: %v", err)
	}
	long.AllowOutlive = true
	if c, err := catool.Intermediate(long); err != nil || !c.NotAfter.After(r.NotAfter) {
		t.Errorf("AllowOutlive: %v", err)
	}
	pl0 := t.TempDir()
	copyFile(t, filepath.Join(dir, catool.CACertFile), filepath.Join(pl0, catool.RootCertFile))
	copyFile(t, filepath.Join(dir, catool.CAKeyFile), filepath.Join(pl0, catool.RootKeyFile))
	if _, err := catool.Intermediate(catool.IntermediateConfig{RootDir: pl0, Dir: t.TempDir(), Name: "x", Clock: fake}); err == nil || !strings.Contains(err.Error(), "pathlen 0") {
		t.Errorf("pathlen-0 root: %v", err)
	}
	for _, name := range []string{"", "a/b", "-x", strings.Repeat("a", 64)} {
		if _, err := catool.Intermediate(catool.IntermediateConfig{RootDir: rootDir, Dir: t.TempDir(), Name: name, Clock: fake}); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
