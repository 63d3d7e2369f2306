package keystore_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
)

// t0 is the reference "now" of the tests.
var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

type certSpec struct {
	cn        string
	isCA      bool
	ku        x509.KeyUsage
	notBefore time.Time
	ttl       time.Duration
	keyType   certs.KeyType
}

type issued struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// mkCert creates a certificate from spec, signed by parent (self-signed
// when parent is nil).
func mkCert(t testing.TB, spec certSpec, parent *issued) *issued {
	t.Helper()
	if spec.notBefore.IsZero() {
		spec.notBefore = t0.Add(-time.Hour)
	}
	if spec.ttl == 0 {
		spec.ttl = 365 * 24 * time.Hour
	}
	if spec.ku == 0 && spec.isCA {
		spec.ku = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	}
	if spec.ku == 0 {
		spec.ku = x509.KeyUsageDigitalSignature
	}
	var key crypto.Signer
	var err error
	if spec.keyType == "rsa-1024" { // too weak for certs.GenerateKey
		key, err = rsa.GenerateKey(rand.Reader, 1024)
	} else {
		key, err = certs.GenerateKey(spec.keyType)
	}
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: spec.cn, Organization: []string{"test"}},
		NotBefore:             spec.notBefore,
		NotAfter:              spec.notBefore.Add(spec.ttl),
		KeyUsage:              spec.ku,
		BasicConstraintsValid: true,
		IsCA:                  spec.isCA,
	}
	signer, parentCert := key, tmpl
	if parent != nil {
		signer, parentCert = parent.key, parent.cert
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &issued{cert: c, key: key}
}

func pemCerts(cs ...*issued) []byte {
	var out []byte
	for _, c := range cs {
		out = append(out, certs.EncodeCertificates(c.cert)...)
	}
	return out
}

func pemKey(t testing.TB, k crypto.Signer) []byte {
	t.Helper()
	b, err := certs.EncodePrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
