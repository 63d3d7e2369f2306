package certs_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

var (
	t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	td = spiffeid.RequireTrustDomainFromString("cluster.local")
	id = spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/web")
)

// hierarchy is a root, an intermediate below it, and a leaf for id.
type hierarchy struct {
	root, inter, leaf *x509.Certificate
	rootKey, interKey crypto.Signer
}

func newHierarchy(t testing.TB) hierarchy {
	t.Helper()
	h := hierarchy{rootKey: testkit.Key(t, certs.ECP256), interKey: testkit.Key(t, certs.ECP256)}
	var err error
	h.root, err = certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: "root"}, Key: h.rootKey, NotBefore: t0.Add(-time.Hour), TTL: 365 * 24 * time.Hour, MaxPathLen: 1})
	if err != nil {
		t.Fatal(err)
	}
	h.inter, err = certs.NewIntermediateCA(certs.CASpec{Subject: pkix.Name{CommonName: "inter"}, Key: h.interKey, NotBefore: t0.Add(-time.Hour), TTL: 30 * 24 * time.Hour, MaxPathLen: 0}, h.root, h.rootKey)
	if err != nil {
		t.Fatal(err)
	}
	h.leaf = issueLeaf(t, h.inter, h.interKey, testkit.Key(t, certs.ECP256).Public(), []*url.URL{id.URL()}, false, t0.Add(time.Hour))
	return h
}

func issueLeaf(t testing.TB, issuer *x509.Certificate, issuerKey crypto.Signer, pub crypto.PublicKey, uris []*url.URL, isCA bool, notAfter time.Time) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), NotBefore: t0.Add(-time.Minute), NotAfter: notAfter, URIs: uris,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	}
	return testkit.Certificate(t, tmpl, issuer, pub, issuerKey)
}

func TestParseKeyType(t *testing.T) {
	for _, kt := range certs.KeyTypes {
		if got, err := certs.ParseKeyType(string(kt)); err != nil || got != kt {
			t.Errorf("ParseKeyType(%q) = %q, %v", kt, got, err)
		}
	}
	if got, err := certs.ParseKeyType(""); err != nil || got != certs.ECP256 {
		t.Errorf("ParseKeyType(\"\") = %q, %v", got, err)
	}
	for _, bad := range []string{"dsa-1024", "EC-P256", "rsa-1024", "ec-p521", " ec-p256"} {
		if _, err := certs.ParseKeyType(bad); err == nil {
			t.Errorf("ParseKeyType(%q) accepted it", bad)
		}
	}
	// CA keys: every type but Ed25519.
	for _, kt := range certs.KeyTypes {
		_, err := certs.ParseCAKeyType(string(kt))
		if (err == nil) != (kt != certs.Ed25519) {
			t.Errorf("ParseCAKeyType(%q): err %v", kt, err)
		}
	}
	if _, err := certs.ParseCAKeyType("ed25519"); err == nil || !strings.Contains(err.Error(), certs.KeyTypeNames(certs.CAKeyTypes)) {
		t.Errorf("ParseCAKeyType(ed25519) error %v does not list the CA key types", err)
	}
}

func TestGenerateKey(t *testing.T) {
	for _, kt := range []certs.KeyType{certs.ECP256, certs.ECP384, certs.RSA2048, certs.Ed25519} {
		k := testkit.Key(t, kt)
		if got := certs.KeyTypeOf(k.Public()); got != string(kt) {
			t.Errorf("KeyTypeOf(GenerateKey(%s)) = %s", kt, got)
		}
		if !certs.KeyMatches(k.Public(), k) {
			t.Errorf("%s: KeyMatches(own key) = false", kt)
		}
		if certs.KeyMatches(testkit.Key(t, kt).Public(), k) {
			t.Errorf("%s: KeyMatches(other key) = true", kt)
		}
		if certs.SignatureAlgorithmFor(k.Public()) == x509.UnknownSignatureAlgorithm {
			t.Errorf("%s: no signature algorithm", kt)
		}
	}
	if _, err := certs.GenerateKey("dsa"); err == nil {
		t.Error("GenerateKey(dsa) succeeded")
	}
}

func TestParseCertificates(t *testing.T) {
	h := newHierarchy(t)
	two := certs.EncodeCertificates(h.leaf, h.inter)
	got, err := certs.ParseCertificates(two)
	if err != nil || len(got) != 2 || !got[0].Equal(h.leaf) || !got[1].Equal(h.inter) {
		t.Fatalf("ParseCertificates = %d certs, %v", len(got), err)
	}
	keyPEM, err := certs.EncodePrivateKey(h.rootKey)
	if err != nil {
		t.Fatal(err)
	}
	bad := pem.EncodeToMemory(&pem.Block{Type: certs.BlockCertificate, Bytes: []byte("not DER")})
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "no PEM"},
		{"not PEM", []byte("hello"), "no PEM"},
		{"key block", append(append([]byte{}, two...), keyPEM...), "unexpected PEM block"},
		{"malformed certificate", bad, "parse certificate 1"},
		{"truncated second block", append(append([]byte{}, two...), two[:len(two)/3]...), "trailing data"},
		{"trailing garbage", append(append([]byte{}, two...), "junk"...), "trailing data"},
	}
	for _, tc := range tests {
		if _, err := certs.ParseCertificates(tc.data); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := certs.ParseCertificates(nil); !errors.Is(err, certs.ErrNoPEM) {
		t.Errorf("empty input: %v, want ErrNoPEM", err)
	}
	// White space around the blocks is fine.
	if got, err := certs.ParseCertificates(append(append([]byte("\n\n"), two...), " \r\n\t"...)); err != nil || len(got) != 2 {
		t.Errorf("white space: %d certs, %v", len(got), err)
	}
}

func TestParsePrivateKey(t *testing.T) {
	ec := testkit.Key(t, certs.ECP256).(*ecdsa.PrivateKey)
	rk := testkit.Key(t, certs.RSA2048).(*rsa.PrivateKey)
	ed := testkit.Key(t, certs.Ed25519).(ed25519.PrivateKey)
	sec1, err := x509.MarshalECPrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	block := func(typ string, der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}) }
	pkcs8 := func(k crypto.Signer) []byte {
		b, err := certs.EncodePrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ecParams := block(certs.BlockECParams, []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07})
	good := []struct {
		name string
		data []byte
		pub  crypto.PublicKey
	}{
		{"PKCS#8 EC", pkcs8(ec), ec.Public()},
		{"PKCS#8 RSA", pkcs8(rk), rk.Public()},
		{"PKCS#8 Ed25519", pkcs8(ed), ed.Public()},
		{"SEC1", block(certs.BlockECKey, sec1), ec.Public()},
		{"PKCS#1", block(certs.BlockRSAKey, x509.MarshalPKCS1PrivateKey(rk)), rk.Public()},
		{"openssl ecparam -genkey", append(append([]byte{}, ecParams...), block(certs.BlockECKey, sec1)...), ec.Public()},
		{"surrounding white space", append(append([]byte("\n\n"), pkcs8(ec)...), " \n\n"...), ec.Public()},
	}
	for _, tc := range good {
		k, err := certs.ParsePrivateKey(tc.data)
		if err != nil || !certs.KeyMatches(tc.pub, k) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	secretDER := bytes.Repeat([]byte{0x5e}, 64) // "secret" key bytes that must not leak
	encrypted := pem.EncodeToMemory(&pem.Block{Type: certs.BlockRSAKey, Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00"}, Bytes: secretDER})
	bad := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"not PEM", []byte("secret")},
		{"two keys", append(pkcs8(ec), pkcs8(rk)...)},
		{"EC PARAMETERS only", ecParams},
		{"certificate", certs.EncodeCertificates(newHierarchy(t).root)},
		{"malformed PKCS#8", block(certs.BlockPKCS8, secretDER)},
		{"SEC1 body in an RSA block", block(certs.BlockRSAKey, sec1)},
		{"encrypted", encrypted},
		{"ENCRYPTED PRIVATE KEY", block("ENCRYPTED PRIVATE KEY", secretDER)},
	}
	for _, tc := range bad {
		_, err := certs.ParsePrivateKey(tc.data)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if strings.Contains(err.Error(), string(secretDER[:8])) || strings.Contains(err.Error(), "Xl5e") {
			t.Errorf("%s: the error %q contains key bytes", tc.name, err)
		}
	}
}

func TestNewCSR(t *testing.T) {
	key := testkit.Key(t, certs.ECP256)
	der, err := certs.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := csr.CheckSignature(); err != nil {
		t.Fatal(err)
	}
	if len(csr.URIs) != 1 || csr.URIs[0].String() != id.String() || len(csr.Subject.Names) != 0 || len(csr.DNSNames) != 0 {
		t.Errorf("CSR URIs %v subject %v DNS %v", csr.URIs, csr.Subject, csr.DNSNames)
	}
	if !certs.KeyMatches(csr.PublicKey, key) {
		t.Error("CSR key is not the signer's")
	}
	b, _ := pem.Decode(certs.EncodeCSR(der))
	if b == nil || b.Type != certs.BlockCSR || !bytes.Equal(b.Bytes, der) {
		t.Error("EncodeCSR did not round-trip")
	}
}

func TestNewCA(t *testing.T) {
	h := newHierarchy(t)
	if !h.root.IsCA || h.root.MaxPathLen != 1 || h.root.KeyUsage&x509.KeyUsageCertSign == 0 || len(h.root.SubjectKeyId) == 0 {
		t.Errorf("root: IsCA %v pathlen %d usage %v", h.root.IsCA, h.root.MaxPathLen, h.root.KeyUsage)
	}
	if !h.inter.IsCA || h.inter.MaxPathLen != 0 || !h.inter.MaxPathLenZero || h.inter.CheckSignatureFrom(h.root) != nil {
		t.Errorf("intermediate: IsCA %v pathlen %d zero %v", h.inter.IsCA, h.inter.MaxPathLen, h.inter.MaxPathLenZero)
	}
	if got := h.root.NotAfter.Sub(h.root.NotBefore); got != 365*24*time.Hour {
		t.Errorf("root lifetime %v", got)
	}
	for name, spec := range map[string]certs.CASpec{
		"no key":       {TTL: time.Hour},
		"zero TTL":     {Key: h.rootKey},
		"negative TTL": {Key: h.rootKey, TTL: -time.Hour},
	} {
		if _, err := certs.NewRootCA(spec); err == nil {
			t.Errorf("%s: NewRootCA accepted it", name)
		}
	}
	s1, _ := certs.NewSerial()
	s2, _ := certs.NewSerial()
	if s1.Sign() <= 0 || s1.Cmp(s2) == 0 || s1.BitLen() > 128 {
		t.Errorf("serials %v %v", s1, s2)
	}
}

func TestVerifyChain(t *testing.T) {
	h := newHierarchy(t)
	other := newHierarchy(t)
	roots := []*x509.Certificate{h.root}
	chains, err := certs.VerifyChain([]*x509.Certificate{h.leaf, h.inter}, roots, t0)
	if err != nil || len(chains) != 1 || len(chains[0]) != 3 || !chains[0][2].Equal(h.root) {
		t.Fatalf("VerifyChain = %v, %v", chains, err)
	}
	// A CA certificate verifies too, and the root alone is a chain.
	if _, err := certs.VerifyChain([]*x509.Certificate{h.inter}, roots, t0); err != nil {
		t.Errorf("intermediate: %v", err)
	}
	caKey := testkit.Key(t, certs.ECP256)
	ca := issueLeaf(t, h.inter, h.interKey, caKey.Public(), nil, true, t0.Add(time.Hour))
	tests := []struct {
		name  string
		chain []*x509.Certificate
		roots []*x509.Certificate
		at    time.Time
	}{
		{"empty chain", nil, roots, t0},
		{"missing intermediate", []*x509.Certificate{h.leaf}, roots, t0},
		{"other roots", []*x509.Certificate{h.leaf, h.inter}, []*x509.Certificate{other.root}, t0},
		{"no roots", []*x509.Certificate{h.leaf, h.inter}, nil, t0},
		{"leaf expired", []*x509.Certificate{h.leaf, h.inter}, roots, t0.Add(2 * time.Hour)},
		{"not yet valid", []*x509.Certificate{h.leaf, h.inter}, roots, t0.Add(-2 * time.Hour)},
		{"intermediate of another CA", []*x509.Certificate{h.leaf, other.inter}, roots, t0},
		{"path length exceeded", []*x509.Certificate{issueLeaf(t, ca, caKey, testkit.Key(t, certs.ECP256).Public(), nil, false, t0.Add(time.Hour)), ca, h.inter}, roots, t0},
	}
	for _, tc := range tests {
		if _, err := certs.VerifyChain(tc.chain, tc.roots, tc.at); err == nil {
			t.Errorf("%s: verified", tc.name)
		}
	}
}

func TestVerifySVID(t *testing.T) {
	h := newHierarchy(t)
	roots := []*x509.Certificate{h.root}
	got, err := certs.VerifySVID([]*x509.Certificate{h.leaf, h.inter}, td, roots, t0)
	if err != nil || got != id {
		t.Fatalf("VerifySVID = %v, %v", got, err)
	}
	otherTD := spiffeid.RequireFromString("spiffe://other.example/ns/default/sa/web")
	tests := []struct {
		name  string
		chain []*x509.Certificate
		want  string
	}{
		{"no URI", []*x509.Certificate{issueLeaf(t, h.inter, h.interKey, testkit.Key(t, certs.ECP256).Public(), nil, false, t0.Add(time.Hour)), h.inter}, "no URI SAN"},
		{"two URIs", []*x509.Certificate{issueLeaf(t, h.inter, h.interKey, testkit.Key(t, certs.ECP256).Public(), []*url.URL{id.URL(), id.URL()}, false, t0.Add(time.Hour)), h.inter}, "more than one URI"},
		{"not SPIFFE", []*x509.Certificate{issueLeaf(t, h.inter, h.interKey, testkit.Key(t, certs.ECP256).Public(), []*url.URL{{Scheme: "https", Host: "cluster.local", Path: "/ns/default/sa/web"}}, false, t0.Add(time.Hour)), h.inter}, "scheme"},
		{"other trust domain", []*x509.Certificate{issueLeaf(t, h.inter, h.interKey, testkit.Key(t, certs.ECP256).Public(), []*url.URL{otherTD.URL()}, false, t0.Add(time.Hour)), h.inter}, "bundle"},
		{"leaf is a CA", []*x509.Certificate{issueLeaf(t, h.inter, h.interKey, testkit.Key(t, certs.ECP256).Public(), []*url.URL{id.URL()}, true, t0.Add(time.Hour)), h.inter}, "CA"},
		{"expired", []*x509.Certificate{issueLeaf(t, h.inter, h.interKey, testkit.Key(t, certs.ECP256).Public(), []*url.URL{id.URL()}, false, t0.Add(-time.Second)), h.inter}, "verify"},
		{"missing intermediate", []*x509.Certificate{h.leaf}, "verify"},
	}
	for _, tc := range tests {
		if _, err := certs.VerifySVID(tc.chain, td, roots, t0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}
