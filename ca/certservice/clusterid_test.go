package certservice_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/testkit"
)

// clusterRecorder records the ClusterID the handler put on the
// credentials, then hands them to next.
type clusterRecorder struct {
	countingAuth
	got []string
}

func (c *clusterRecorder) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	c.got = append(c.got, creds.ClusterID)
	return c.countingAuth.Authenticate(ctx, creds)
}

// TestClusterIDMetadata: the ClusterID metadata reaches the authenticators
// as Credentials.ClusterID; one that is not a string or not a cluster ID
// (odd characters, too long, 1 MB) is refused before authentication.
func TestClusterIDMetadata(t *testing.T) {
	rec := &clusterRecorder{}
	e := newEnv(t, envOpts{auths: func(e *env) []authn.Authenticator {
		rec.next = e.srvAuth(t)
		return []authn.Authenticator{rec}
	}})
	c := e.client(t, "localhost", nil)
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
	ctx := withToken(context.Background(), e.token(t, "shop", "cart"))
	call := func(v *structpb.Value) error {
		var md *structpb.Struct
		if v != nil {
			md = &structpb.Struct{Fields: map[string]*structpb.Value{"ClusterID": v}}
		}
		_, err := c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, Metadata: md})
		return err
	}
	for _, id := range []string{"", "east-1"} {
		if err := call(structpb.NewStringValue(id)); err != nil {
			t.Fatalf("ClusterID %q: %v", id, err)
		}
	}
	if err := call(nil); err != nil {
		t.Fatal(err)
	}
	if strings.Join(rec.got, ",") != ",east-1," {
		t.Fatalf("authenticators saw ClusterIDs %q", rec.got)
	}
	calls := rec.calls.Load()
	for name, v := range map[string]*structpb.Value{
		"number":     structpb.NewNumberValue(1),
		"slash":      structpb.NewStringValue("../../etc"),
		"newline":    structpb.NewStringValue("a\nlevel=ERROR msg=forged"),
		"unicode":    structpb.NewStringValue("clüster"),
		"254 bytes":  structpb.NewStringValue(strings.Repeat("a", 254)),
		"200 KB":     structpb.NewStringValue(strings.Repeat("a", 200<<10)),
		"NUL inside": structpb.NewStringValue("a\x00b"),
	} {
		err := call(v)
		if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 400 {
			t.Errorf("%s: %v (%d bytes), want a short InvalidArgument", name, status.Code(err), len(err.Error()))
		}
	}
	// 1 MB exceeds the request size limit: refused by gRPC itself.
	if err := call(structpb.NewStringValue(strings.Repeat("a", 1<<20))); status.Code(err) == codes.OK {
		t.Fatal("1 MB ClusterID accepted")
	}
	if n := rec.calls.Load(); n != calls {
		t.Fatalf("%d bad ClusterIDs reached authentication", n-calls)
	}
}

// TestClusterIDHeaderOfJWTRequests: a JWT-SVID request names its cluster
// in the ClusterID header (its message has no metadata); the value reaches
// the authenticators as for CreateCertificate, and a bad one (odd
// characters, too long, sent twice) is refused before authentication.
func TestClusterIDHeaderOfJWTRequests(t *testing.T) {
	rec := &clusterRecorder{}
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOpts{
		cfg: func(c *certservice.Config) { c.JWT = iss },
		auths: func(e *env) []authn.Authenticator {
			rec.next = e.srvAuth(t)
			return []authn.Authenticator{rec}
		},
	})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: e.pool(), ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := jwtapi.NewClient(conn)
	ctx := withToken(context.Background(), e.token(t, "shop", "cart"))
	call := func(kv ...string) error {
		_, err := c.MintJWTSVID(metadata.AppendToOutgoingContext(ctx, kv...), &workloadpb.JWTSVIDRequest{Audience: []string{"orders"}})
		return err
	}
	for _, kv := range [][]string{nil, {"ClusterID", "east-1"}, {"clusterid", ""}} {
		if err := call(kv...); err != nil {
			t.Fatalf("%q: %v", kv, err)
		}
	}
	if strings.Join(rec.got, ",") != ",east-1," {
		t.Fatalf("authenticators saw ClusterIDs %q", rec.got)
	}
	calls := rec.calls.Load()
	for name, kv := range map[string][]string{
		"slash":     {"ClusterID", "../../etc"},
		"space":     {"ClusterID", "east 1"},
		"254 bytes": {"ClusterID", strings.Repeat("a", 254)},
		"twice":     {"ClusterID", "east-1", "clusterid", "west-2"},
	} {
		err := call(kv...)
		if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 400 {
			t.Errorf("%s: %v (%d bytes), want a short InvalidArgument", name, err, len(err.Error()))
		}
	}
	if n := rec.calls.Load(); n != calls {
		t.Fatalf("%d bad ClusterIDs reached authentication", n-calls)
	}
}

// TestClusterInLogs: a certificate for a caller proved by a remote
// cluster's API server is logged (at debug) with that cluster, and only
// then; a refused request's log line names the ClusterID the request sent,
// and has no cluster_id when it sent none.
func TestClusterInLogs(t *testing.T) {
	logs := testkit.NewLogRecorder()
	e := newEnv(t, envOpts{
		auths: func(*env) []authn.Authenticator {
			return []authn.Authenticator{callers{
				"local":  {Namespace: "shop", ServiceAccount: "cart", Method: authn.MethodTokenReview},
				"remote": {Namespace: "shop", ServiceAccount: "cart", Cluster: "east-1", Method: authn.MethodTokenReview},
			}}
		},
		cfg: func(c *certservice.Config) { c.Logger = logs.Logger() },
	})
	c := e.client(t, "localhost", nil)
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
	call := func(token, csr string, md map[string]any) error {
		s, err := structpb.NewStruct(md)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CreateCertificate(withToken(context.Background(), token), &securityv1alpha1.IstioCertificateRequest{Csr: csr, Metadata: s})
		return err
	}
	const remoteLine = "certificate request from a remote cluster cluster_id=east-1 caller=shop/cart (tokenreview, cluster east-1)"
	if err := call("local", csr, nil); err != nil {
		t.Fatal(err)
	}
	if n := logs.Count("certificate request from a remote cluster"); n != 0 {
		t.Fatalf("a local caller logged as remote:\n%s", logs.All())
	}
	if err := call("remote", csr, nil); err != nil {
		t.Fatal(err)
	}
	if n := logs.Count(remoteLine); n != 1 {
		t.Fatalf("%d lines %q in:\n%s", n, remoteLine, logs.All())
	}

	const refused = "certificate request refused"
	if err := call("local", "not a CSR", map[string]any{"ClusterID": "west-2"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad CSR: %v", err)
	}
	if err := call("local", "not a CSR", nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad CSR: %v", err)
	}
	lines := strings.Split(logs.All(), "\n")
	var got []string
	for _, l := range lines {
		if strings.HasPrefix(l, refused) {
			got = append(got, l)
		}
	}
	if len(got) != 2 || !strings.HasSuffix(got[0], " cluster_id=west-2") || strings.Contains(got[1], "cluster_id") {
		t.Fatalf("refusal lines, want the first only with cluster_id=west-2:\n%s", strings.Join(got, "\n"))
	}
}
