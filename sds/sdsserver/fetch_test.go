package sdsserver_test

import (
	"context"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

func TestFetchSecrets(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
		defer cancel()
		r, err := h.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: []string{dflt, root}})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetResources()) != 2 || r.GetVersionInfo() == "" || r.GetNonce() == "" || r.GetTypeUrl() != sdsserver.SecretTypeURL {
			t.Fatalf("response %v", r)
		}
		cert, roots := unpack(t, r.GetResources()[0]), unpack(t, r.GetResources()[1])
		chain, key := tlsCert(t, cert)
		verifySVID(t, chain, key, trustedCA(t, roots))

		r, err = h.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: []string{root}, Node: spiffeNode(structpb.NewStringValue("true"))})
		if err != nil {
			t.Fatal(err)
		}
		checkSPIFFEValidator(t, unpack(t, r.GetResources()[0]), e.roots())
	})
}

func TestFetchSecretsErrors(t *testing.T) {
	e := fakeEnv(t)
	later, _ := e.later(t)
	h := start(t, e.src)
	tests := []struct {
		name string
		req  *discoveryv3.DiscoveryRequest
		code codes.Code
	}{
		{"unknown name", &discoveryv3.DiscoveryRequest{ResourceNames: []string{dflt, "no-such-secret"}}, codes.NotFound},
		{"not ready", &discoveryv3.DiscoveryRequest{ResourceNames: []string{later}}, codes.Unavailable},
		{"no names", &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL}, codes.InvalidArgument},
		{"wrong type", &discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", ResourceNames: []string{dflt}}, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.FetchSecrets(context.Background(), tc.req)
			if status.Code(err) != tc.code {
				t.Fatalf("error %v, want code %v", err, tc.code)
			}
		})
	}
	for reason, want := range map[string]float64{"unknown_resource": 1, "no_resource_names": 1, "type_url": 1} {
		h.wantMetric(t, want, "meshid_agent_sds_bad_requests_total", "reason", reason)
	}
}

// FetchSecrets on a fresh agent waits for the first certificate: one CSR
// however many callers.
func TestFetchSecretsWaitsForFirstCertificate(t *testing.T) {
	p := newPKI(t, nil)
	m := newManager(t, p, nil)
	h := start(t, m)
	errs := make(chan error, 10)
	for range 10 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
			defer cancel()
			_, err := h.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: []string{dflt}})
			errs <- err
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := p.csrs.Load(); n != 1 {
		t.Errorf("%d CSRs, want 1", n)
	}
}
