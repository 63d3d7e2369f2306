package caserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/testkit"
)

// TestUnknownClusterIDWithoutRouter (issue 28, hole 5): a CA with offline
// JWT only (no Kubernetes client, no remote cluster: `meshid dev`,
// `meshid server --jwks-file`) refuses a token sent with a ClusterID other
// than its --cluster-id, Unauthenticated and naming the cluster, as a CA
// with a cluster router does; for a JWT-SVID too (the ClusterID header).
// No ClusterID and the CA's own are accepted: Istio's agents send their
// CLUSTER_ID, "Kubernetes" by default, the default --cluster-id. On
// c30f24e the ClusterID was ignored and every one of these tokens signed.
func TestUnknownClusterIDWithoutRouter(t *testing.T) {
	for _, tc := range []struct {
		clusterID      string // the CA's; "" is the default
		accept, refuse []string
	}{
		{"", []string{"", "Kubernetes"}, []string{"west"}},
		{"east", []string{"", "east"}, []string{"Kubernetes", "west"}},
	} {
		t.Run("cluster-id="+tc.clusterID, func(t *testing.T) {
			dir := t.TempDir()
			iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
			if err != nil {
				t.Fatal(err)
			}
			s := testkit.CA(t, caserver.Config{
				TrustDomain: exampleTD,
				StateDir:    dir,
				Authn: caserver.AuthnConfig{
					JWTIssuer: iss.Issuer(),
					JWKSFile:  filepath.Join(dir, devissuer.JWKSFile),
				},
				Clusters: caserver.ClustersConfig{
					ID: tc.clusterID,
				},
			})
			roots := x509.NewCertPool()
			for _, r := range s.Authority().Bundle().Roots {
				roots.AddCert(r)
			}
			conn, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost"})))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			tok, err := iss.Mint("shop", "cart", []string{"istio-ca"}, time.Hour, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok), testkit.Guard)
			defer cancel()
			csr := string(testkit.CSRPEM(t, testkit.Key(t, certs.ECP256), spiffeid.RequireFromSegments(exampleTD, "ns", "shop", "sa", "cart")))
			certificate := func(id string) error {
				req := &securityv1alpha1.IstioCertificateRequest{Csr: csr}
				if id != "" {
					req.Metadata, _ = structpb.NewStruct(map[string]any{"ClusterID": id})
				}
				_, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, req)
				return err
			}
			jwtSVID := func(id string) error {
				ctx := ctx
				if id != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, "clusterid", id)
				}
				_, err := jwtapi.NewClient(conn).MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"orders"}})
				return err
			}
			for what, call := range map[string]func(string) error{"certificate": certificate, "JWT-SVID": jwtSVID} {
				for _, id := range tc.accept {
					if err := call(id); err != nil {
						t.Errorf("%s with ClusterID %q: %v", what, id, err)
					}
				}
				for _, id := range tc.refuse {
					err := call(id)
					if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), `unknown cluster "`+id+`"`) {
						t.Errorf("%s with ClusterID %q: %v, want Unauthenticated naming the cluster", what, id, err)
					}
				}
			}
		})
	}
}
