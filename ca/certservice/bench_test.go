package certservice_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	securityv1alpha1 "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// benchCallers is the number of distinct identities (one per concurrent
// caller at c64); each has csrsPerCaller pre-generated P-256 CSRs.
const (
	benchCallers  = 64
	csrsPerCaller = 4
)

type benchCaller struct {
	token string
	csrs  []string
}

// fakeTokenReview answers every TokenReview for a token minted by the dev
// issuer as an authenticated service account, so that the benchmark
// measures the CA with a warm TokenReview cache, as in a cluster.
func fakeTokenReview(b *testing.B) authn.Authenticator {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		ns, sa, _ := strings.Cut(strings.SplitN(tr.Spec.Token, ".", 2)[0], "/") // see benchToken
		tr.Status = authenticationv1.TokenReviewStatus{
			Authenticated: true,
			User:          authenticationv1.UserInfo{Username: "system:serviceaccount:" + ns + ":" + sa, Groups: []string{"system:serviceaccounts"}},
			Audiences:     []string{"istio-ca"},
		}
		return true, tr, nil
	})
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: cs})
	if err != nil {
		b.Fatal(err)
	}
	return tr
}

// BenchmarkCreateCertificateGRPC measures end-to-end CreateCertificate
// over gRPC+TLS on loopback: c concurrent callers, each on its own
// connection, P-256 leaf keys and CSRs generated beforehand, an ec-p256
// self-signed CA, and authentication answered from the TokenReview cache.
func BenchmarkCreateCertificateGRPC(b *testing.B) {
	benchGRPC(b, func(e *env) []authn.Authenticator { return []authn.Authenticator{fakeTokenReview(b)} }, false)
}

// BenchmarkCreateCertificateGRPCJWT is the same with offline JWT
// verification (an ES256 signature check per request) instead.
func BenchmarkCreateCertificateGRPCJWT(b *testing.B) {
	benchGRPC(b, nil, true)
}

func benchGRPC(b *testing.B, auths func(*env) []authn.Authenticator, jwt bool) {
	e := newEnv(b, envOpts{auths: auths})
	callers := make([]benchCaller, benchCallers)
	for i := range callers {
		ns, sa := "bench", fmt.Sprintf("sa-%d", i)
		if jwt {
			callers[i].token = e.token(b, ns, sa)
		} else {
			callers[i].token = ns + "/" + sa + "." + fmt.Sprint(i) // opaque to everything but the fake API server
		}
		for range csrsPerCaller {
			callers[i].csrs = append(callers[i].csrs, csrFor(b, testkit.Key(b, certs.ECP256), sid(ns, sa), nil))
		}
	}
	for _, c := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("c%d", c), func(b *testing.B) {
			clients := make([]securityv1alpha1.IstioCertificateServiceClient, c)
			for i := range clients {
				clients[i] = e.client(b, "istiod.istio-system.svc", nil)
				// Connect, handshake and warm the authentication cache.
				bc := callers[i%len(callers)]
				if _, err := clients[i].CreateCertificate(withToken(context.Background(), bc.token), &securityv1alpha1.IstioCertificateRequest{Csr: bc.csrs[0]}); err != nil {
					b.Fatal(err)
				}
			}
			raw, rawCPU := rawBound(b, callers, e.authority.Bundle().Key, 500*time.Millisecond)
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, c)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for w := range c {
				wg.Add(1)
				go func() {
					defer wg.Done()
					bc := callers[w%len(callers)]
					ctx := withToken(context.Background(), bc.token)
					for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
						req := &securityv1alpha1.IstioCertificateRequest{Csr: bc.csrs[int(n)%len(bc.csrs)]}
						if _, err := clients[w].CreateCertificate(ctx, req); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			cpu := (processCPU() - cpu0) / time.Duration(b.N)
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
			rate := float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "certs/s")
			b.ReportMetric(raw, "raw-certs/s")
			b.ReportMetric(100*rate/raw, "%-of-raw")
			// CPU time per certificate, client included (it runs in this
			// process), against the raw bound's: immune to other load.
			b.ReportMetric(float64(cpu.Microseconds()), "cpu-µs/cert")
			b.ReportMetric(float64(rawCPU.Microseconds()), "raw-cpu-µs/cert")
			b.ReportMetric(100*float64(rawCPU)/float64(cpu), "%-of-raw-cpu")
		})
	}
}

// rawBound measures, just before the timed loop and on every CPU, the
// issuances per second the machine could do if an issuance cost only its
// two public-key operations: the CSR signature check and one signature by
// the CA key. The gRPC figure is reported as a percentage of it.
func rawBound(b *testing.B, callers []benchCaller, caKey crypto.Signer, d time.Duration) (perSec float64, cpuPerOp time.Duration) {
	b.Helper()
	var csrs []*x509.CertificateRequest
	for _, c := range callers[:8] {
		for _, p := range c.csrs {
			blk, _ := pem.Decode([]byte(p))
			csr, err := x509.ParseCertificateRequest(blk.Bytes)
			if err != nil {
				b.Fatal(err)
			}
			csrs = append(csrs, csr)
		}
	}
	workers := runtime.GOMAXPROCS(0)
	var ops atomic.Int64
	var wg sync.WaitGroup
	start, cpu0 := time.Now(), processCPU()
	deadline := start.Add(d)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(deadline); i++ {
				csr := csrs[i%len(csrs)]
				if err := csr.CheckSignature(); err != nil {
					b.Error(err)
					return
				}
				digest := sha256.Sum256(csr.RawTBSCertificateRequest)
				if _, err := caKey.Sign(rand.Reader, digest[:], crypto.SHA256); err != nil {
					b.Error(err)
					return
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	n := ops.Load()
	return float64(n) / time.Since(start).Seconds(), (processCPU() - cpu0) / time.Duration(n)
}
