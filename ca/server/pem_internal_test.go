package server

import (
	"crypto/rand"
	"encoding/pem"
	"testing"
)

func TestCertificatePEM(t *testing.T) {
	for _, n := range []int{0, 1, 47, 48, 49, 95, 96, 97, 500, 1234} {
		der := make([]byte, n)
		rand.Read(der)
		want := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		if got := certificatePEM(der); got != want {
			t.Fatalf("%d bytes:\n%s\nwant\n%s", n, got, want)
		}
	}
}

func BenchmarkCertificatePEM(b *testing.B) {
	der := make([]byte, 600)
	rand.Read(der)
	b.Run("pem.EncodeToMemory", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		}
	})
	b.Run("certificatePEM", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = certificatePEM(der)
		}
	})
}
