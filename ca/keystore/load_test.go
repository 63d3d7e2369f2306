package keystore_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
)

// hierarchy is root -> int1 -> ca (the signing CA), plus an unrelated root.
type hierarchy struct {
	root, int1, ca, other *issued
}

func newHierarchy(t *testing.T) hierarchy {
	t.Helper()
	root := mkCert(t, certSpec{cn: "root", isCA: true, ttl: 10 * 365 * 24 * time.Hour}, nil)
	int1 := mkCert(t, certSpec{cn: "int1", isCA: true}, root)
	ca := mkCert(t, certSpec{cn: "ca", isCA: true, ttl: 180 * 24 * time.Hour}, int1)
	other := mkCert(t, certSpec{cn: "other root", isCA: true}, nil)
	return hierarchy{root: root, int1: int1, ca: ca, other: other}
}

func istioFiles(t *testing.T, ca *issued, chain, roots []byte) map[string][]byte {
	return map[string][]byte{
		keystore.CACertFile:    pemCerts(ca),
		keystore.CAKeyFile:     pemKey(t, ca.key),
		keystore.CertChainFile: chain,
		keystore.RootCertFile:  roots,
	}
}

func writeDir(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if data == nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadAccepts(t *testing.T) {
	h := newHierarchy(t)
	selfCA := mkCert(t, certSpec{cn: "self", isCA: true}, nil)
	ecKey := h.ca.key.(*ecdsa.PrivateKey)
	sec1, err := x509.MarshalECPrivateKey(ecKey)
	if err != nil {
		t.Fatal(err)
	}
	rsaCA := mkCert(t, certSpec{cn: "rsa ca", isCA: true, keyType: certs.RSA2048}, h.int1)

	tests := []struct {
		name      string
		files     map[string][]byte
		wantCert  *issued
		wantInter []*issued
		wantRoots []*issued
	}{
		{
			name:      "chain includes ca-cert and root",
			files:     istioFiles(t, h.ca, pemCerts(h.ca, h.int1, h.root), pemCerts(h.root)),
			wantCert:  h.ca,
			wantInter: []*issued{h.int1},
			wantRoots: []*issued{h.root},
		},
		{
			name:      "chain holds only the intermediate",
			files:     istioFiles(t, h.ca, pemCerts(h.int1), pemCerts(h.root)),
			wantCert:  h.ca,
			wantInter: []*issued{h.int1},
			wantRoots: []*issued{h.root},
		},
		{
			name:      "chain in reverse order",
			files:     istioFiles(t, h.ca, pemCerts(h.root, h.int1, h.ca), pemCerts(h.root)),
			wantCert:  h.ca,
			wantInter: []*issued{h.int1},
			wantRoots: []*issued{h.root},
		},
		{
			name:      "several roots in root-cert.pem",
			files:     istioFiles(t, h.ca, pemCerts(h.int1, h.root), pemCerts(h.other, h.root)),
			wantCert:  h.ca,
			wantInter: []*issued{h.int1},
			wantRoots: []*issued{h.other, h.root},
		},
		{
			name:      "ca-cert is the root",
			files:     istioFiles(t, h.root, pemCerts(h.root), pemCerts(h.root)),
			wantCert:  h.root,
			wantRoots: []*issued{h.root},
		},
		{
			name:      "istio-ca-secret with empty chain and roots",
			files:     istioFiles(t, selfCA, []byte{}, []byte{}),
			wantCert:  selfCA,
			wantRoots: []*issued{selfCA},
		},
		{
			name: "SEC1 key with EC PARAMETERS block",
			files: map[string][]byte{
				keystore.CACertFile:    pemCerts(h.ca),
				keystore.CAKeyFile:     append(pemBlock("EC PARAMETERS", []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}), pemBlock("EC PRIVATE KEY", sec1)...),
				keystore.CertChainFile: pemCerts(h.int1, h.root),
				keystore.RootCertFile:  pemCerts(h.root),
			},
			wantCert:  h.ca,
			wantInter: []*issued{h.int1},
			wantRoots: []*issued{h.root},
		},
		{
			name: "PKCS#1 RSA key",
			files: map[string][]byte{
				keystore.CACertFile:    pemCerts(rsaCA),
				keystore.CAKeyFile:     pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaCA.key.(*rsa.PrivateKey))),
				keystore.CertChainFile: pemCerts(h.int1, h.root),
				keystore.RootCertFile:  pemCerts(h.root),
			},
			wantCert:  rsaCA,
			wantInter: []*issued{h.int1},
			wantRoots: []*issued{h.root},
		},
		{
			name: "tls layout with chain in tls.crt",
			files: map[string][]byte{
				keystore.TLSCertFile: pemCerts(h.ca, h.int1),
				keystore.TLSKeyFile:  pemKey(t, h.ca.key),
				keystore.TLSCAFile:   pemCerts(h.root),
			},
			wantCert:  h.ca,
			wantInter: []*issued{h.int1},
			wantRoots: []*issued{h.root},
		},
		{
			name: "tls layout, self-signed without ca.crt",
			files: map[string][]byte{
				keystore.TLSCertFile: pemCerts(selfCA),
				keystore.TLSKeyFile:  pemKey(t, selfCA.key),
			},
			wantCert:  selfCA,
			wantRoots: []*issued{selfCA},
		},
	}
	for _, tc := range tests {
		check := func(t *testing.T, b *keystore.Bundle, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if !b.Cert.Equal(tc.wantCert.cert) {
				t.Errorf("Cert = %q, want %q", b.Cert.Subject, tc.wantCert.cert.Subject)
			}
			if !certs.KeyMatches(b.Cert.PublicKey, b.Key) {
				t.Errorf("Key does not match Cert")
			}
			if got, want := subjects(b.Intermediates), subjectsOf(tc.wantInter); got != want {
				t.Errorf("Intermediates = %s, want %s", got, want)
			}
			if got, want := subjects(b.Roots), subjectsOf(tc.wantRoots); got != want {
				t.Errorf("Roots = %s, want %s", got, want)
			}
			if err := b.Validate(t0); err != nil {
				t.Errorf("Validate: %v", err)
			}
		}
		t.Run(tc.name+"/files", func(t *testing.T) {
			b, err := keystore.LoadFiles(tc.files, t0)
			check(t, b, err)
		})
		t.Run(tc.name+"/dir", func(t *testing.T) {
			b, err := keystore.LoadDir(writeDir(t, tc.files), t0)
			check(t, b, err)
		})
	}
}

func subjects(cs []*x509.Certificate) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.Subject.CommonName)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func subjectsOf(is []*issued) string {
	var cs []*x509.Certificate
	for _, i := range is {
		cs = append(cs, i.cert)
	}
	return subjects(cs)
}

func TestLoadRejects(t *testing.T) {
	h := newHierarchy(t)
	notCA := mkCert(t, certSpec{cn: "leafish", isCA: false}, h.int1)
	noCertSign := mkCert(t, certSpec{cn: "no certsign", isCA: true, ku: x509.KeyUsageDigitalSignature}, h.int1)
	expired := mkCert(t, certSpec{cn: "expired", isCA: true, notBefore: t0.Add(-48 * time.Hour), ttl: 24 * time.Hour}, h.int1)
	future := mkCert(t, certSpec{cn: "future", isCA: true, notBefore: t0.Add(time.Hour)}, h.int1)
	expiredInt := mkCert(t, certSpec{cn: "expired int", isCA: true, notBefore: t0.Add(-48 * time.Hour), ttl: 24 * time.Hour}, h.root)
	underExpiredInt := mkCert(t, certSpec{cn: "under expired int", isCA: true, notBefore: t0.Add(-47 * time.Hour)}, expiredInt)
	expiredRoot := mkCert(t, certSpec{cn: "expired root", isCA: true, notBefore: t0.Add(-48 * time.Hour), ttl: 24 * time.Hour}, nil)
	underExpiredRoot := mkCert(t, certSpec{cn: "under expired root", isCA: true, notBefore: t0.Add(-47 * time.Hour)}, expiredRoot)
	weak := mkCert(t, certSpec{cn: "weak", isCA: true, keyType: "rsa-1024"}, h.int1)
	leafInChain := mkCert(t, certSpec{cn: "leaf in chain", isCA: false}, h.root)
	underLeaf := mkCert(t, certSpec{cn: "under leaf", isCA: true}, leafInChain)
	garbage := []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")

	good := func() map[string][]byte { return istioFiles(t, h.ca, pemCerts(h.int1), pemCerts(h.root)) }
	with := func(name string, data []byte) map[string][]byte {
		f := good()
		f[name] = data
		return f
	}
	tests := []struct {
		name  string
		files map[string][]byte
		want  []string // substrings of the error
	}{
		{"no files", map[string][]byte{}, []string{"no CA files found"}},
		{"missing ca-cert.pem", with(keystore.CACertFile, nil), []string{"ca-cert.pem: missing"}},
		{"missing ca-key.pem", with(keystore.CAKeyFile, nil), []string{"ca-key.pem: missing"}},
		{"missing root-cert.pem", with(keystore.RootCertFile, nil), []string{"root-cert.pem: missing", "ca-cert.pem is not self-signed"}},
		{"missing cert-chain.pem", with(keystore.CertChainFile, nil), []string{"ca-cert.pem does not chain to", "root-cert.pem", "cert-chain.pem", "unknown authority"}},
		{"missing tls.key", map[string][]byte{keystore.TLSCertFile: pemCerts(h.ca, h.int1), keystore.TLSCAFile: pemCerts(h.root)}, []string{"tls.key: missing"}},
		{"garbage ca-cert.pem", with(keystore.CACertFile, garbage), []string{"ca-cert.pem:", "parse certificate"}},
		{"not PEM ca-cert.pem", with(keystore.CACertFile, []byte("hello")), []string{"ca-cert.pem:", "no PEM"}},
		{"garbage ca-key.pem", with(keystore.CAKeyFile, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")), []string{"ca-key.pem:", "cannot parse the private key"}},
		{"not PEM ca-key.pem", with(keystore.CAKeyFile, []byte("secret")), []string{"ca-key.pem:", "no PEM private key"}},
		{"garbage cert-chain.pem", with(keystore.CertChainFile, garbage), []string{"cert-chain.pem:", "parse certificate"}},
		{"truncated cert-chain.pem", with(keystore.CertChainFile, append(pemCerts(h.int1), "-----BEGIN CERT"...)), []string{"cert-chain.pem:", "trailing data"}},
		{"garbage root-cert.pem", with(keystore.RootCertFile, garbage), []string{"root-cert.pem:", "parse certificate"}},
		{"key does not match cert", with(keystore.CAKeyFile, pemKey(t, h.int1.key)), []string{"ca-key.pem: private key does not match", "ca-cert.pem"}},
		{"not a CA", istioFiles(t, notCA, pemCerts(h.int1), pemCerts(h.root)), []string{"ca-cert.pem:", "not a CA"}},
		{"CA without keyCertSign", istioFiles(t, noCertSign, pemCerts(h.int1), pemCerts(h.root)), []string{"ca-cert.pem:", "keyCertSign"}},
		{"broken chain: other root", with(keystore.RootCertFile, pemCerts(h.other)), []string{"ca-cert.pem does not chain to", "root-cert.pem"}},
		{"broken chain: chain ends at unknown root", istioFiles(t, h.ca, pemCerts(h.int1, h.root), pemCerts(h.other)), []string{"does not chain to"}},
		{"non-CA in chain", istioFiles(t, underLeaf, pemCerts(leafInChain), pemCerts(h.root)), []string{"cert-chain.pem:", "not a CA"}},
		{"expired CA", istioFiles(t, expired, pemCerts(h.int1), pemCerts(h.root)), []string{"ca-cert.pem:", "expired at"}},
		{"not yet valid CA", istioFiles(t, future, pemCerts(h.int1), pemCerts(h.root)), []string{"ca-cert.pem:", "not valid until"}},
		{"expired intermediate", istioFiles(t, underExpiredInt, pemCerts(expiredInt), pemCerts(h.root)), []string{"cert-chain.pem:", "expired at"}},
		{"expired root", istioFiles(t, underExpiredRoot, nil, pemCerts(expiredRoot)), []string{"root-cert.pem:", "expired at"}},
		{"weak CA key", istioFiles(t, weak, pemCerts(h.int1), pemCerts(h.root)), []string{"ca-cert.pem:", "too weak"}},
	}
	for _, tc := range tests {
		check := func(t *testing.T, b *keystore.Bundle, err error) {
			t.Helper()
			if err == nil {
				t.Fatalf("load succeeded, want error containing %q", tc.want)
			}
			t.Log(err)
			if b != nil {
				t.Errorf("load returned a bundle with its error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if !strings.HasPrefix(err.Error(), "keystore: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		}
		t.Run(tc.name+"/files", func(t *testing.T) {
			b, err := keystore.LoadFiles(tc.files, t0)
			check(t, b, err)
		})
		t.Run(tc.name+"/dir", func(t *testing.T) {
			dir := writeDir(t, tc.files)
			b, err := keystore.LoadDir(dir, t0)
			check(t, b, err)
			if err != nil && tc.name != "no files" && !strings.Contains(err.Error(), dir) {
				t.Errorf("error %q does not name the file's path under %s", err, dir)
			}
		})
	}
}

func TestLoadDirNotFound(t *testing.T) {
	_, err := keystore.LoadDir(filepath.Join(t.TempDir(), "nope"), t0)
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("err = %v, want one naming the missing directory", err)
	}
}

func TestValidate(t *testing.T) {
	h := newHierarchy(t)
	int2 := mkCert(t, certSpec{cn: "int2", isCA: true}, h.int1)
	deep := mkCert(t, certSpec{cn: "deep", isCA: true}, int2)
	tests := []struct {
		name string
		b    *keystore.Bundle
		now  time.Time
		want string // "" = valid
	}{
		{"valid", &keystore.Bundle{Cert: h.ca.cert, Key: h.ca.key, Intermediates: []*x509.Certificate{h.int1.cert}, Roots: []*x509.Certificate{h.root.cert}}, t0, ""},
		{"valid, two intermediates", &keystore.Bundle{Cert: deep.cert, Key: deep.key, Intermediates: []*x509.Certificate{int2.cert, h.int1.cert}, Roots: []*x509.Certificate{h.root.cert}}, t0, ""},
		{"intermediates out of order", &keystore.Bundle{Cert: deep.cert, Key: deep.key, Intermediates: []*x509.Certificate{h.int1.cert, int2.cert}, Roots: []*x509.Certificate{h.root.cert}}, t0, "issuer order"},
		{"unrelated intermediate", &keystore.Bundle{Cert: h.ca.cert, Key: h.ca.key, Intermediates: []*x509.Certificate{h.int1.cert, h.other.cert}, Roots: []*x509.Certificate{h.root.cert}}, t0, "issuer order"},
		{"no key", &keystore.Bundle{Cert: h.ca.cert, Roots: []*x509.Certificate{h.root.cert}}, t0, "no private key"},
		{"no cert", &keystore.Bundle{Key: h.ca.key, Roots: []*x509.Certificate{h.root.cert}}, t0, "no CA certificate"},
		{"no roots", &keystore.Bundle{Cert: h.ca.cert, Key: h.ca.key}, t0, "no root"},
		{"expired later", &keystore.Bundle{Cert: h.ca.cert, Key: h.ca.key, Intermediates: []*x509.Certificate{h.int1.cert}, Roots: []*x509.Certificate{h.root.cert}}, t0.Add(200 * 24 * time.Hour), "expired at"},
		{"before validity", &keystore.Bundle{Cert: h.ca.cert, Key: h.ca.key, Intermediates: []*x509.Certificate{h.int1.cert}, Roots: []*x509.Certificate{h.root.cert}}, t0.Add(-2 * time.Hour), "not valid until"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.b.Validate(tc.now)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

// TestLoadDirRootOnly: a root directory from `meshid certs root` given as a
// CA directory gets an error that says what to run, not "missing".
func TestLoadDirRootOnly(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{keystore.RootCertFile: "x", keystore.RootKeyFile: "y"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := keystore.LoadDir(dir, time.Now())
	if err == nil || !strings.Contains(err.Error(), "run `meshid certs intermediate --root "+dir) {
		t.Fatalf("root-only directory: %v", err)
	}
}

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
