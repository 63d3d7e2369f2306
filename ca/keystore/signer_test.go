package keystore_test

import (
	"crypto"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// opaqueKey stands for a key held outside the process (a PKCS#11 module):
// only its crypto.Signer methods are reachable.
type opaqueKey struct{ crypto.Signer }

func (opaqueKey) String() string { return "test module key" }

func TestLoadDirSigner(t *testing.T) {
	h := newHierarchy(t)
	files := istioFiles(t, h.ca, pemCerts(h.int1), pemCerts(h.root))
	delete(files, keystore.CAKeyFile)
	dir := writeDir(t, files)

	b, err := keystore.LoadDirSigner(dir, opaqueKey{h.ca.key}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Cert.Equal(h.ca.cert) || len(b.Intermediates) != 1 {
		t.Fatalf("bundle %v", b.Cert.Subject)
	}

	other := mkCert(t, certSpec{cn: "x", isCA: true}, nil)
	if _, err := keystore.LoadDirSigner(dir, opaqueKey{other.key}, t0); err == nil || !strings.Contains(err.Error(), "test module key: private key does not match") {
		t.Fatalf("wrong module key: %v", err)
	}
	if _, err := keystore.LoadDirSigner(dir, nil, t0); err == nil {
		t.Fatal("nil key accepted")
	}
	// A key file beside a module key: which key would the CA use? Refused.
	withFile := writeDir(t, istioFiles(t, h.ca, pemCerts(h.int1), pemCerts(h.root)))
	if _, err := keystore.LoadDirSigner(withFile, opaqueKey{h.ca.key}, t0); err == nil || !strings.Contains(err.Error(), "remove the key file") {
		t.Fatalf("key file beside a module key: %v", err)
	}
}

func TestLoadOrCreateSelfSignedExternalKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	cfg := keystore.SelfSignedConfig{Dir: dir, TrustDomain: "cluster.local", Clock: clock.NewFake(t0), Key: opaqueKey{key}}
	first, err := keystore.LoadOrCreateSelfSigned(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !certs.KeyMatches(first.Cert.PublicKey, key) {
		t.Fatal("root not made for the external key")
	}
	if _, err := os.Stat(filepath.Join(dir, keystore.CAKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ca-key.pem written for an external key: %v", err)
	}
	second, err := keystore.LoadOrCreateSelfSigned(cfg)
	if err != nil || !second.Cert.Equal(first.Cert) {
		t.Fatalf("restart: %v", err)
	}
	// Another key against the same state directory: refused, not a new root.
	other, _ := certs.GenerateKey(certs.ECP256)
	cfg.Key = opaqueKey{other}
	if _, err := keystore.LoadOrCreateSelfSigned(cfg); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("other key: %v", err)
	}
}
