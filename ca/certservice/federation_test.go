package certservice_test

import (
	"context"
	"crypto/tls"
	"testing"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/internal/federationapi"
)

// fakeFederation holds fixed federated bundles.
type fakeFederation struct{ encoded, jwks map[string][]byte }

func (f fakeFederation) FederatedBundles() (map[string][]byte, map[string][]byte) {
	return f.encoded, f.jwks
}

// The CA hands the federated bundles to any caller over its TLS, and adds
// the federated JWT keys to FetchJWTBundles beside its own, each under its
// own trust domain; a CA without federation answers an empty map.
func TestFederatedBundlesService(t *testing.T) {
	fed := fakeFederation{
		encoded: map[string][]byte{"spiffe://b.example": []byte(`{"keys":[]}`)},
		jwks:    map[string][]byte{"spiffe://b.example": []byte(`{"keys":[]}`)},
	}
	e, jc := jwtEnv(t, func(c *certservice.Config) { c.Federation = fed })
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: e.pool(), ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	resp, err := federationapi.NewClient(conn).FetchFederatedBundles(context.Background(), &workloadpb.X509BundlesRequest{})
	if err != nil || len(resp.Bundles) != 1 || string(resp.Bundles["spiffe://b.example"]) != `{"keys":[]}` {
		t.Fatalf("FetchFederatedBundles = %v, %v", resp, err)
	}
	jb, err := jc.FetchJWTBundles(t.Context(), &workloadpb.JWTBundlesRequest{})
	if err != nil || len(jb.Bundles) != 2 || jb.Bundles[td.IDString()] == nil || jb.Bundles["spiffe://b.example"] == nil {
		t.Fatalf("FetchJWTBundles = %d bundles, %v", len(jb.Bundles), err)
	}
	if len(fed.jwks) != 1 {
		t.Fatal("FetchJWTBundles modified the federation's map")
	}

	plain := newEnv(t, envOpts{})
	conn2, err := grpc.NewClient(plain.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: plain.pool(), ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn2.Close() })
	resp, err = federationapi.NewClient(conn2).FetchFederatedBundles(context.Background(), &workloadpb.X509BundlesRequest{})
	if err != nil || len(resp.Bundles) != 0 {
		t.Fatalf("without federation: %v, %v", resp, err)
	}
}
