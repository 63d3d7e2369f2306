package kubetest

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/keystore"
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
