package keystore_test

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

func TestNewSelfSignedRootKeyTypes(t *testing.T) {
	for _, kt := range []certs.KeyType{"", certs.ECP256, certs.ECP384, certs.RSA2048, certs.RSA3072, certs.RSA4096} {
		t.Run(string(kt), func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(t0)
			b, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: "example.org", KeyType: kt, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			want := string(kt)
			if kt == "" {
				want = string(certs.ECP256)
			}
			if got := certs.KeyTypeOf(b.Cert.PublicKey); got != want {
				t.Errorf("key type %s, want %s", got, want)
			}
			c := b.Cert
			if got := c.Subject.Organization; len(got) != 1 || got[0] != "example.org" {
				t.Errorf("O = %q, want [example.org]", got)
			}
			if c.Subject.CommonName != keystore.RootCommonName {
				t.Errorf("CN = %q", c.Subject.CommonName)
			}
			if !c.IsCA || !c.BasicConstraintsValid || c.KeyUsage&x509.KeyUsageCertSign == 0 {
				t.Errorf("root is not a CA with keyCertSign: IsCA=%v KeyUsage=%v", c.IsCA, c.KeyUsage)
			}
			if !c.NotBefore.Before(t0) || c.NotBefore.Before(t0.Add(-time.Hour)) {
				t.Errorf("NotBefore %v, want shortly before %v", c.NotBefore, t0)
			}
			if got := c.NotAfter.Sub(c.NotBefore); got != keystore.DefaultRootTTL {
				t.Errorf("lifetime %v, want %v", got, keystore.DefaultRootTTL)
			}
			if len(b.Roots) != 1 || !b.Roots[0].Equal(c) || len(b.Intermediates) != 0 {
				t.Errorf("roots/intermediates wrong: %d roots, %d intermediates", len(b.Roots), len(b.Intermediates))
			}
			if err := b.Validate(t0); err != nil {
				t.Errorf("Validate: %v", err)
			}
			// The files load back to the same bundle.
			b2, err := keystore.LoadFiles(files, t0)
			if err != nil {
				t.Fatalf("LoadFiles(own files): %v", err)
			}
			if !b2.Cert.Equal(c) || !certs.KeyMatches(c.PublicKey, b2.Key) {
				t.Errorf("files do not round-trip")
			}
		})
	}
}

func TestNewSelfSignedRootRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  keystore.SelfSignedConfig
		want string
	}{
		{"no trust domain", keystore.SelfSignedConfig{}, "trust domain is required"},
		{"ed25519 root", keystore.SelfSignedConfig{TrustDomain: "td", KeyType: certs.Ed25519}, "not supported"},
		{"unknown key type", keystore.SelfSignedConfig{TrustDomain: "td", KeyType: "dsa"}, "not supported"},
		{"negative TTL", keystore.SelfSignedConfig{TrustDomain: "td", TTL: -time.Hour}, "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := keystore.NewSelfSignedRoot(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadOrCreateSelfSigned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	clk := clock.NewFake(t0)
	cfg := keystore.SelfSignedConfig{Dir: dir, TrustDomain: "cluster.local", Clock: clk, TTL: 365 * 24 * time.Hour}

	first, err := keystore.LoadOrCreateSelfSigned(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, keystore.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Errorf("ca-key.pem mode %#o, want 0600", perm)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode: %v %v, want 0700", st.Mode().Perm(), err)
	}
	rootPEM, err := os.ReadFile(filepath.Join(dir, keystore.RootCertFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rootPEM, certs.EncodeCertificates(first.Cert)) {
		t.Errorf("root-cert.pem does not hold the root")
	}
	if got := first.Cert.NotAfter.Sub(first.Cert.NotBefore); got != cfg.TTL {
		t.Errorf("TTL %v, want %v", got, cfg.TTL)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}

	// Restart: the same root and key are reused, root-cert.pem is rewritten,
	// and a changed key type does not replace the root.
	if err := os.Remove(filepath.Join(dir, keystore.RootCertFile)); err != nil {
		t.Fatal(err)
	}
	clk.Add(24 * time.Hour)
	cfg.KeyType = certs.RSA2048
	second, err := keystore.LoadOrCreateSelfSigned(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !second.Cert.Equal(first.Cert) || !certs.KeyMatches(first.Cert.PublicKey, second.Key) {
		t.Fatalf("restart created a new root")
	}
	if _, err := os.Stat(filepath.Join(dir, keystore.RootCertFile)); err != nil {
		t.Errorf("root-cert.pem not rewritten on restart: %v", err)
	}
}

func TestLoadOrCreateSelfSignedRejects(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		later time.Duration // time between the first and the second start
		want  string
	}{
		{
			name: "key readable by others",
			setup: func(t *testing.T, dir string) {
				if err := os.Chmod(filepath.Join(dir, keystore.CAKeyFile), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			want: "want 0600",
		},
		{
			name: "corrupt ca-cert.pem is not replaced",
			setup: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, keystore.CACertFile), []byte("junk"), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			want: "ca-cert.pem",
		},
		{
			name:  "expired root is not replaced",
			setup: func(t *testing.T, dir string) {},
			later: 2 * time.Hour, // the root lives 1h
			want:  "expired at",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := clock.NewFake(t0)
			cfg := keystore.SelfSignedConfig{Dir: dir, TrustDomain: "cluster.local", Clock: clk, TTL: time.Hour}
			if _, err := keystore.LoadOrCreateSelfSigned(cfg); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir)
			before, _ := os.ReadFile(filepath.Join(dir, keystore.CACertFile))
			clk.Add(tc.later)
			_, err := keystore.LoadOrCreateSelfSigned(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			after, _ := os.ReadFile(filepath.Join(dir, keystore.CACertFile))
			if !bytes.Equal(before, after) {
				t.Errorf("ca-cert.pem was rewritten after a failed load")
			}
		})
	}
	if _, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{TrustDomain: "td"}); err == nil {
		t.Errorf("no Dir: want an error")
	}
}
