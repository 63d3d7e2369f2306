package ca_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// The benchmarks use an ec-p256 CA (the default root) and report
// certificates per second for each leaf key type, on one goroutine.

var benchLeafKeys = []certs.KeyType{certs.ECP256, certs.RSA2048}

// BenchmarkSign measures the CA's work per request: ParseCSR (PEM, parse,
// signature check) and Sign (policy, leaf, signature, parse, audit log).
func BenchmarkSign(b *testing.B) {
	bundle := rootBundle(b, certs.ECP256, t0)
	a := newAuthority(b, bundle, clock.Real{})
	for _, kt := range benchLeafKeys {
		b.Run(string(kt), func(b *testing.B) {
			pemCSR, _ := mkCSR(b, csrSpec{key: mustKey(b, kt), uris: []string{callerID.String()}})
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				csr, err := ca.ParseCSR(pemCSR)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := a.Sign(ctx, ca.Request{CSR: csr, ID: callerID, Caller: "bench"}); err != nil {
					b.Fatal(err)
				}
			}
			reportThroughput(b, processCPU()-cpu0)
		})
	}
}

// BenchmarkRawBound is the crypto lower bound of an issuance with the same
// keys: one CSR signature check plus one x509.CreateCertificate (which
// signs and then verifies its own signature).
func BenchmarkRawBound(b *testing.B) {
	bundle := rootBundle(b, certs.ECP256, t0)
	for _, kt := range benchLeafKeys {
		b.Run(string(kt), func(b *testing.B) {
			pemCSR, _ := mkCSR(b, csrSpec{key: mustKey(b, kt), uris: []string{callerID.String()}})
			parsed, err := ca.ParseCSR(pemCSR)
			if err != nil {
				b.Fatal(err)
			}
			csr := parsed.Request()
			serial, err := certs.NewSerial()
			if err != nil {
				b.Fatal(err)
			}
			u, _ := url.Parse(callerID.String())
			tmpl := baselineLeaf(serial, u)
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if err := csr.CheckSignature(); err != nil {
					b.Fatal(err)
				}
				if _, err := x509.CreateCertificate(rand.Reader, tmpl, bundle.Cert, csr.PublicKey, bundle.Key); err != nil {
					b.Fatal(err)
				}
			}
			reportThroughput(b, processCPU()-cpu0)
		})
	}
}

// reportThroughput reports certificates per wall-clock second and the
// process CPU time per certificate (which other load on the machine does
// not distort, unlike wall-clock figures).
func reportThroughput(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

// BenchmarkLeafSignature compares the CA's share of an issuance without the
// CSR check: Authority.Sign of a CSR that ParseCSR already checked (leaf
// built and signed once, then parsed, as ca/sign.go does), against
// x509.CreateCertificate for the same leaf, which also verifies the
// signature it has just made. The difference is the self-verification that
// ca/sign.go explains the CA does not need per certificate.
func BenchmarkLeafSignature(b *testing.B) {
	bundle := rootBundle(b, certs.ECP256, t0)
	a := newAuthority(b, bundle, clock.Real{})
	pemCSR, _ := mkCSR(b, csrSpec{key: mustKey(b, certs.ECP256), uris: []string{callerID.String()}})
	csr, err := ca.ParseCSR(pemCSR)
	if err != nil {
		b.Fatal(err)
	}
	pub := csr.Request().PublicKey
	b.Run("authority", func(b *testing.B) {
		ctx := context.Background()
		b.ReportAllocs()
		cpu0 := processCPU()
		for b.Loop() {
			if _, err := a.Sign(ctx, ca.Request{CSR: csr, ID: callerID, Caller: "bench"}); err != nil {
				b.Fatal(err)
			}
		}
		reportThroughput(b, processCPU()-cpu0)
	})
	b.Run("x509.CreateCertificate", func(b *testing.B) {
		u, _ := url.Parse(callerID.String())
		b.ReportAllocs()
		cpu0 := processCPU()
		for b.Loop() {
			serial, err := certs.NewSerial()
			if err != nil {
				b.Fatal(err)
			}
			tmpl := baselineLeaf(serial, u)
			if _, err := x509.CreateCertificate(rand.Reader, tmpl, bundle.Cert, pub, bundle.Key); err != nil {
				b.Fatal(err)
			}
		}
		reportThroughput(b, processCPU()-cpu0)
	})
}

// baselineLeaf is the workload leaf the baselines sign with crypto/x509
// alone, shaped as the Authority's.
func baselineLeaf(serial *big.Int, u *url.URL) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             t0,
		NotAfter:              t0.Add(ca.DefaultTTL),
		URIs:                  []*url.URL{u},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
}
