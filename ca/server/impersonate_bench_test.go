package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	securityv1alpha1 "istio.io/api/security/v1alpha1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/ca/server"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/testkit"
)

// BenchmarkImpersonationBurst plays ztunnel starting on a node with 100
// pods (100 service accounts): 8 concurrent CreateCertificate calls over
// one gRPC+TLS connection, each naming a workload in ImpersonatedIdentity,
// P-256 CSRs made beforehand, authentication answered as from a warm
// TokenReview cache, node authorization on a synced informer. "own" is
// the same node agent asking for its own identity, for comparison.
func BenchmarkImpersonationBurst(b *testing.B) {
	const pods, concurrency = 100, 8
	objs := []k8sruntime.Object{ambientPod("istio-system", "ztunnel-a", "ztunnel", "node-a")}
	for i := range pods {
		objs = append(objs, ambientPod("burst", fmt.Sprintf("app-%d", i), fmt.Sprintf("sa-%d", i), "node-a"))
	}
	na, err := nodeauth.New(nodeauth.Config{
		TrustedAccounts: []identity.ServiceAccount{{Namespace: "istio-system", Name: "ztunnel"}},
		Client:          fake.NewClientset(objs...), TrustDomain: td,
	})
	if err != nil {
		b.Fatal(err)
	}
	testkit.Run(b, "node authorizer", na.Run)
	waitUntil(b, na.HasSynced)
	e := newEnv(b, envOpts{
		auths: func(*env) []authn.Authenticator { return []authn.Authenticator{ambientCallers} },
		cfg:   func(c *server.Config) { c.NodeAuthorizer = na },
	})
	imp := make([]*securityv1alpha1.IstioCertificateRequest, pods)
	own := make([]*securityv1alpha1.IstioCertificateRequest, pods)
	for i := range pods {
		id := sid("burst", fmt.Sprintf("sa-%d", i)).String()
		imp[i] = impersonationRequest(b, id, map[string]any{server.ImpersonatedIdentityKey: id})
		own[i] = &securityv1alpha1.IstioCertificateRequest{Csr: csrFor(b, testkit.Key(b, certs.ECP256), sid("istio-system", "ztunnel"), nil)}
	}
	c := e.client(b, "localhost", nil)
	ctx := withToken(context.Background(), "ztunnel-a")
	for _, run := range []struct {
		name string
		reqs []*securityv1alpha1.IstioCertificateRequest
	}{{"impersonated", imp}, {"own", own}} {
		reqs := run.reqs
		b.Run(run.name, func(b *testing.B) {
			if _, err := c.CreateCertificate(ctx, reqs[0]); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, concurrency)
			b.ResetTimer()
			for range concurrency {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
						if _, err := c.CreateCertificate(ctx, reqs[int(n)%len(reqs)]); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
		})
	}
}
