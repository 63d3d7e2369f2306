package caclient_test

import (
	"context"
	"crypto/x509"
	"net"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/testkit"
)

// TestRealCAJWTSVID: the client mints a JWT-SVID from the real CA server
// and fetches the bundle that validates it; a request for another identity
// is refused by the CA.
func TestRealCAJWTSVID(t *testing.T) {
	r := startRealCA(t, 0)
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := testkit.ServeCA(t, certservice.Config{Authority: r.authority, Authenticator: r.auth, JWT: iss})
	tok := tokenPath(t)
	r.token(tok, "default", "default")
	c := newClient(t, caclient.Config{Addr: addr, ServerName: "localhost", Roots: r.roots, TokenFile: tok})
	id := spiffeid.RequireFromString(workload)
	svid, err := c.MintJWTSVID(context.Background(), id, []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.FetchJWTBundles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, err := jwtbundle.Parse(td, raw[td.IDString()])
	if err != nil {
		t.Fatal(err)
	}
	if got, err := jwtsvid.ParseAndValidate(svid, b, []string{"orders"}); err != nil || got.ID != id {
		t.Fatalf("ParseAndValidate: %v, %v", got, err)
	}
	other := spiffeid.RequireFromString("spiffe://cluster.local/ns/kube-system/sa/admin")
	if _, err := c.MintJWTSVID(context.Background(), other, []string{"orders"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another identity: %v, want PermissionDenied", err)
	}
}

// TestMintJWTSVIDRefusesWrongAnswers: a CA answer naming another identity,
// or more than one token, is refused as an invalid response.
func TestMintJWTSVIDRefusesWrongAnswers(t *testing.T) {
	for name, resp := range map[string]*workloadpb.JWTSVIDResponse{
		"other identity": {Svids: []*workloadpb.JWTSVID{{SpiffeId: "spiffe://cluster.local/ns/a/sa/b", Svid: "x"}}},
		"two tokens":     {Svids: []*workloadpb.JWTSVID{{SpiffeId: workload, Svid: "x"}, {SpiffeId: workload, Svid: "y"}}},
		"empty token":    {Svids: []*workloadpb.JWTSVID{{SpiffeId: workload}}},
		"none":           {},
	} {
		t.Run(name, func(t *testing.T) {
			c := fakeJWTCA(t, resp)
			_, err := c.MintJWTSVID(context.Background(), spiffeid.RequireFromString(workload), []string{"a"})
			if caclient.FailureCode(err) != "invalid_response" {
				t.Errorf("err = %v, want an invalid response", err)
			}
		})
	}
	c := fakeJWTCA(t, nil)
	if _, err := c.FetchJWTBundles(context.Background()); caclient.FailureCode(err) != "invalid_response" {
		t.Errorf("no bundle: err = %v, want an invalid response", err)
	}
}

// fakeJWTCA serves resp to every MintJWTSVID over TLS, and returns a client
// of it with a valid token.
func fakeJWTCA(t *testing.T, resp *workloadpb.JWTSVIDResponse) *caclient.Client {
	t.Helper()
	ca := startCA(t, []string{"localhost"}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(ca.tls)))
	jwtapi.Register(srv, fixedJWT{resp})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	tok := tokenPath(t)
	writeToken(t, tok, "a-token")
	return newClient(t, caclient.Config{Addr: lis.Addr().String(), ServerName: "localhost", Roots: []*x509.Certificate{ca.h.root}, TokenFile: tok})
}

type fixedJWT struct{ resp *workloadpb.JWTSVIDResponse }

func (f fixedJWT) MintJWTSVID(context.Context, *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error) {
	return f.resp, nil
}

func (f fixedJWT) FetchJWTBundles(context.Context, *workloadpb.JWTBundlesRequest) (*workloadpb.JWTBundlesResponse, error) {
	return &workloadpb.JWTBundlesResponse{}, nil
}

// clusterSeen records the ClusterID the CA's authentication saw.
type clusterSeen struct {
	next authn.Authenticator
	got  []string
}

func (c *clusterSeen) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	c.got = append(c.got, creds.ClusterID)
	return c.next.Authenticate(ctx, creds)
}

// TestMintJWTSVIDSendsClusterID: with Config.ClusterID the JWT-SVID
// request names the agent's cluster (as a header: the message has no
// metadata), so the real CA routes it as it routes CreateCertificate.
func TestMintJWTSVIDSendsClusterID(t *testing.T) {
	r := startRealCA(t, 0)
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td})
	if err != nil {
		t.Fatal(err)
	}
	seen := &clusterSeen{next: r.auth}
	addr, _ := testkit.ServeCA(t, certservice.Config{Authority: r.authority, Authenticator: seen, JWT: iss})
	tok := tokenPath(t)
	r.token(tok, "default", "default")
	id := spiffeid.RequireFromString(workload)
	for _, cluster := range []string{"east-1", ""} {
		c := newClient(t, caclient.Config{Addr: addr, ServerName: "localhost", Roots: r.roots, TokenFile: tok, ClusterID: cluster})
		if _, err := c.MintJWTSVID(context.Background(), id, []string{"orders"}); err != nil {
			t.Fatalf("ClusterID %q: %v", cluster, err)
		}
	}
	if len(seen.got) != 2 || seen.got[0] != "east-1" || seen.got[1] != "" {
		t.Errorf("the CA saw ClusterIDs %q, want east-1 then none", seen.got)
	}
}
