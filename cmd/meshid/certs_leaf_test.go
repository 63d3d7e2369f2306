package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/testkit"
)

// TestCertsLeaf: a minted leaf and key pass `meshid inspect` against the
// roots written alongside; the key goes only to a new 0600 file unless
// --force-insecure-output.
func TestCertsLeaf(t *testing.T) {
	withCLIClock(t, cliNow)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rootDir, west := filepath.Join(dir, "root"), filepath.Join(dir, "west")
	meshidOK(t, "certs", "root", "--out", rootDir)
	meshidOK(t, "certs", "intermediate", "--root", rootDir, "--out", west, "--name", "west")
	id := "spiffe://cluster.local/ns/shop/sa/cart"
	cert, key, roots := filepath.Join(dir, "cart.pem"), filepath.Join(dir, "cart-key.pem"), filepath.Join(dir, "roots.pem")
	meshidOK(t, "certs", "leaf", "--id", id, "--ca-dir", west, "--ttl", "2h", "--out-cert", cert, "--out-key", key, "--out-roots", roots)
	if m := testkit.FilePerm(t, key); m != 0o600 {
		t.Errorf("key mode %o", m)
	}
	chain := testkit.ReadCerts(t, cert)
	if len(chain) != 2 || chain[0].URIs[0].String() != id || !chain[0].NotAfter.Equal(cliNow.Add(2*time.Hour)) {
		t.Fatalf("chain of %d, leaf %v until %v", len(chain), chain[0].URIs, chain[0].NotAfter)
	}
	out := meshidOK(t, "inspect", "--roots", roots, cert, key)
	if !strings.Contains(out, id) {
		t.Fatalf("inspect:\n%s", out)
	}

	keyBefore, _ := os.ReadFile(key)
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"existing key file", []string{"--out-key", key}, 1, "exists: refusing to write a private key there without --force-insecure-output"},
		{"key to stdout", []string{"--out-key", "-"}, 1, "--force-insecure-output"},
		{"bad id", []string{"--out-key", filepath.Join(dir, "k2"), "--id", "https://x"}, cli.ExitUsage, "--id"},
		{"missing --out-key", nil, cli.ExitUsage, `"out-key"`},
		{"root-only dir", []string{"--out-key", filepath.Join(dir, "k3"), "--ca-dir", rootDir}, 1, "meshid certs intermediate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"certs", "leaf", "--id", id, "--ca-dir", west, "--out-cert", filepath.Join(dir, "c.pem")}, tc.args...)
			_, errOut, code := meshidRun(t, nil, args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errOut, tc.code, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(key); string(b) != string(keyBefore) {
		t.Fatal("the existing key file changed")
	}
	out, _, code := meshidRun(t, nil, "certs", "leaf", "--id", id, "--ca-dir", west, "--out-key", "-", "--force-insecure-output")
	if code != 0 || !strings.Contains(out, "PRIVATE KEY") || !strings.Contains(out, "CERTIFICATE") {
		t.Fatalf("--force-insecure-output: exit %d\n%s", code, out)
	}
}
