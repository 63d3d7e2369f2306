package kubetest

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
)

// SelfSigned returns the files of a new self-signed root in Istio's layout
// and its certificate.
func SelfSigned(t testing.TB, org string) (map[string][]byte, *x509.Certificate) {
	t.Helper()
	b, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: org})
	if err != nil {
		t.Fatal(err)
	}
	return files, b.Cert
}

// Plugged returns the files of an operator CA in Istio's cacerts layout: an
// intermediate (ca-cert.pem) under a new root. It returns the intermediate
// and the root.
func Plugged(t testing.TB, name string) (map[string][]byte, *x509.Certificate, *x509.Certificate) {
	t.Helper()
	now := time.Now()
	rootKey, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	root, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: name + " root"}, Key: rootKey,
		NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: -1})
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	inter, err := certs.NewIntermediateCA(certs.CASpec{Subject: pkix.Name{CommonName: name + " intermediate"}, Key: key,
		NotBefore: now.Add(-time.Hour), TTL: 24 * time.Hour, MaxPathLen: 0}, root, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := certs.EncodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		keystore.CACertFile:    certs.EncodeCertificates(inter),
		keystore.CAKeyFile:     keyPEM,
		keystore.CertChainFile: certs.EncodeCertificates(inter, root),
		keystore.RootCertFile:  certs.EncodeCertificates(root),
	}, inter, root
}

// Eventually polls cond every 10ms until it returns true, failing the test
// with msg after 20s.
func Eventually(t testing.TB, msg string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting: %s", msg)
	}
}
