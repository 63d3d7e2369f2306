package keystore_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
)

// FuzzLoadDir writes fuzzed contents as a plugged-in CA directory (the
// cacerts layout, or the TLS layout when tls is set) and loads it.
// Properties:
//   - LoadDir never panics, and agrees with LoadFiles on the same contents
//     (both accept, or both refuse);
//   - an error starts with "keystore:" and never holds the key file's PEM
//     body;
//   - an accepted bundle validates (Bundle.Validate at the same time), its
//     key matches its certificate, and its signing certificate is the first
//     one of the certificate file.
func FuzzLoadDir(f *testing.F) {
	root := mkCert(f, certSpec{cn: "root", isCA: true, ttl: 10 * 365 * 24 * time.Hour}, nil)
	int1 := mkCert(f, certSpec{cn: "int1", isCA: true}, root)
	ca := mkCert(f, certSpec{cn: "ca", isCA: true, ttl: 180 * 24 * time.Hour}, int1)
	rsaCA := mkCert(f, certSpec{cn: "rsa ca", isCA: true, keyType: certs.RSA2048}, root)
	leaf := mkCert(f, certSpec{cn: "leaf"}, ca)
	expired := mkCert(f, certSpec{cn: "old", isCA: true, notBefore: t0.Add(-48 * time.Hour), ttl: time.Hour}, root)
	caKey, rootKey := pemKey(f, ca.key), pemKey(f, root.key)

	for _, s := range []struct {
		cert, key, chain, roots []byte
		tls                     bool
	}{
		{pemCerts(ca), caKey, pemCerts(ca, int1, root), pemCerts(root), false},
		{pemCerts(ca), caKey, pemCerts(int1), pemCerts(root), false},
		{pemCerts(ca, int1), caKey, nil, pemCerts(root), true},
		{pemCerts(root), rootKey, nil, nil, false}, // self-signed, no root file
		{pemCerts(rsaCA), pemKey(f, rsaCA.key), nil, pemCerts(root), false},
		{pemCerts(ca), rootKey, pemCerts(int1), pemCerts(root), false}, // wrong key
		{pemCerts(leaf), pemKey(f, leaf.key), pemCerts(ca, int1), pemCerts(root), false},
		{pemCerts(expired), pemKey(f, expired.key), nil, pemCerts(root), false},
		{pemCerts(ca), caKey, pemCerts(root, int1), pemCerts(root), false}, // chain out of order
		{pemCerts(ca), caKey, nil, pemCerts(root), false},                  // chain missing
		{pemCerts(ca), caKey[:len(caKey)/2], nil, pemCerts(root), true},
		{[]byte("junk"), []byte("-----BEGIN junk"), nil, nil, false},
		{nil, nil, nil, nil, false},
	} {
		f.Add(s.cert, s.key, s.chain, s.roots, s.tls)
	}

	good := map[string][]byte{keystore.CACertFile: pemCerts(ca), keystore.CAKeyFile: caKey, keystore.CertChainFile: pemCerts(int1), keystore.RootCertFile: pemCerts(root)}
	if _, err := keystore.LoadFiles(good, t0); err != nil {
		f.Fatalf("the valid seed is refused: %v", err)
	}

	f.Fuzz(func(t *testing.T, cert, key, chain, roots []byte, tls bool) {
		files := map[string][]byte{
			keystore.CACertFile: cert, keystore.CAKeyFile: key, keystore.CertChainFile: chain, keystore.RootCertFile: roots,
		}
		if tls {
			files = map[string][]byte{keystore.TLSCertFile: cert, keystore.TLSKeyFile: key, keystore.TLSCAFile: roots}
		}
		dir := t.TempDir()
		for name, data := range files {
			if len(data) == 0 {
				continue // an absent file, as in a Secret without the key
			}
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		b, err := keystore.LoadDir(dir, t0)
		_, ferr := keystore.LoadFiles(files, t0)
		if (err == nil) != (ferr == nil) {
			t.Fatalf("LoadDir: %v; LoadFiles: %v", err, ferr)
		}
		if err != nil {
			for _, e := range []error{err, ferr} {
				msg := e.Error()
				if !strings.HasPrefix(msg, "keystore: ") {
					t.Fatalf("error %q does not start with keystore:", msg)
				}
				for _, l := range strings.Split(string(key), "\n") {
					if l = strings.TrimSpace(l); len(l) >= 16 && !strings.HasPrefix(l, "-----") && strings.Contains(msg, l) {
						t.Fatalf("error %q holds a line of the key file", msg)
					}
				}
			}
			return
		}
		if err := b.Validate(t0); err != nil {
			t.Fatalf("accepted a bundle that does not validate: %v", err)
		}
		if !certs.KeyMatches(b.Cert.PublicKey, b.Key) {
			t.Fatal("accepted a key that does not match the certificate")
		}
		first, err := certs.ParseCertificates(cert)
		if err != nil || !bytes.Equal(first[0].Raw, b.Cert.Raw) {
			t.Fatalf("the signing certificate is not the first of the certificate file (%v)", err)
		}
	})
}
