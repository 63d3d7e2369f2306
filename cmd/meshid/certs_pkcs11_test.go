//go:build cgo

package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/keystore/pkcs11/softhsm"
	"github.com/meshid/meshid/certs"
)

// TestCertsIntermediateKeyInModule: `meshid certs intermediate --key
// pkcs11:...` creates the intermediate's key in a real SoftHSM2 token and
// writes no key file; the directory loads as a CA with that module key.
func TestCertsIntermediateKeyInModule(t *testing.T) {
	tk := softhsm.New(t)
	dir := t.TempDir()
	rootDir, west := filepath.Join(dir, "root"), filepath.Join(dir, "west")
	meshidOK(t, "certs", "root", "--out", rootDir)
	uri := tk.URI("west-intermediate")
	out := meshidOK(t, "certs", "intermediate", "--root", rootDir, "--out", west, "--name", "west", "--key", uri)
	if !strings.Contains(out, "not extractable") {
		t.Errorf("output does not report the module key: %s", out)
	}
	if _, err := os.Stat(filepath.Join(west, keystore.CAKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ca-key.pem written for a module key: %v", err)
	}
	u, err := pkcs11.ParseURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pkcs11.New(pkcs11.Config{URI: u})
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	b, err := keystore.LoadDirSigner(west, key, time.Now())
	if err != nil {
		t.Fatalf("the directory does not load with the module key: %v", err)
	}
	if !certs.KeyMatches(b.Cert.PublicKey, key) || b.Cert.Subject.Locality[0] != "west" {
		t.Fatalf("intermediate %q is not for the module key", b.Cert.Subject)
	}
	if _, err := keystore.LoadDir(west, time.Now()); err == nil {
		t.Fatal("the directory loads without a key")
	}
	key.Close()

	// The same label again: refused, the module key is not replaced.
	_, errOut, code := meshidRun(t, nil, "certs", "intermediate", "--root", rootDir, "--out", filepath.Join(dir, "again"), "--name", "again", "--key", uri)
	if code == 0 || !strings.Contains(errOut, "already holds") {
		t.Fatalf("second intermediate over the same module key: exit %d: %s", code, errOut)
	}
	// Not a URI, and a bad URI: clear errors before anything is created.
	for _, bad := range []string{"/etc/ca-key.pem", "pkcs11:token=meshid;object=x?module-path=/m.so&pin-value=1"} {
		_, errOut, code := meshidRun(t, nil, "certs", "intermediate", "--root", rootDir, "--out", filepath.Join(dir, "bad"), "--name", "bad", "--key", bad)
		if code == 0 || !strings.Contains(errOut, "--key") {
			t.Fatalf("--key %s: exit %d: %s", bad, code, errOut)
		}
	}
}
