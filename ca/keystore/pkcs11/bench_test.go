//go:build cgo

package pkcs11_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11/softhsm"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// BenchmarkSignModule compares leaf issuance through ca.Authority with the
// CA key in SoftHSM2 (C_Sign through crypto11, plus the CA's verification
// of each signature from a non-stdlib signer) against the same CA key type
// in memory. It reports certs/s; -cpu 1,2 shows how the module scales.
//
//	go test -run '^$' -bench BenchmarkSignModule -benchtime 2s -cpu 1,2 ./ca/keystore/pkcs11
func BenchmarkSignModule(b *testing.B) {
	for _, kt := range []certs.KeyType{certs.ECP256, certs.RSA2048} {
		b.Run(string(kt)+"/memory", func(b *testing.B) {
			bundle, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), KeyType: kt})
			if err != nil {
				b.Fatal(err)
			}
			benchSign(b, bundle)
		})
		b.Run(string(kt)+"/softhsm2", func(b *testing.B) {
			tk := softhsm.New(b)
			key := generate(b, tk, "ca", kt)
			bundle, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), Key: key})
			if err != nil {
				b.Fatal(err)
			}
			benchSign(b, bundle)
		})
	}
}

func benchSign(b *testing.B, bundle *keystore.Bundle) {
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: bundle, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	id := spiffeid.RequireFromPath(td, "/ns/default/sa/web")
	csr, err := ca.VerifyCSR(testkit.CSR(b, testkit.Key(b, certs.ECP256), id))
	if err != nil {
		b.Fatal(err)
	}
	req := ca.Request{CSR: csr, ID: id, Caller: "bench"}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := a.Sign(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}
