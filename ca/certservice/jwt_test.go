package certservice_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/testkit"
)

// jwtEnv is a CA serving JWT-SVIDs, and a client of that service.
func jwtEnv(t *testing.T, cfg func(*certservice.Config)) (*env, *jwtapi.Client) {
	t.Helper()
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOpts{cfg: func(c *certservice.Config) {
		c.JWT = iss
		if cfg != nil {
			cfg(c)
		}
	}})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: e.pool(), ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return e, jwtapi.NewClient(conn)
}

func TestMintJWTSVIDForTheProvenCaller(t *testing.T) {
	e, c := jwtEnv(t, nil)
	ctx := withToken(t.Context(), e.token(t, "shop", "cart"))
	resp, err := c.MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"orders"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Svids) != 1 || resp.Svids[0].SpiffeId != sid("shop", "cart").String() {
		t.Fatalf("svids = %v", resp.Svids)
	}
	// Validated by go-spiffe against the bundle the CA publishes, fetched
	// without credentials.
	bundles, err := c.FetchJWTBundles(t.Context(), &workloadpb.JWTBundlesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := jwtbundle.Parse(td, bundles.Bundles[td.IDString()])
	if err != nil {
		t.Fatal(err)
	}
	svid, err := jwtsvid.ParseAndValidate(resp.Svids[0].Svid, b, []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != sid("shop", "cart") {
		t.Errorf("sub = %s", svid.ID)
	}
	if _, err := jwtsvid.ParseAndValidate(resp.Svids[0].Svid, b, []string{"payments"}); err == nil {
		t.Error("validated for an audience it was not minted for")
	}
	// Naming one's own identity is allowed.
	if _, err := c.MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}, SpiffeId: sid("shop", "cart").String()}); err != nil {
		t.Errorf("own spiffe_id: %v", err)
	}
}

// TestMintJWTSVIDRefusals is the attacker's view: every refusal has its
// gRPC code, from ca/errors.go through Code.
func TestMintJWTSVIDRefusals(t *testing.T) {
	e, c := jwtEnv(t, func(cfg *certservice.Config) { cfg.RateLimit, cfg.RateBurst = 1, 1 })
	tok := e.token(t, "shop", "cart")
	other := e.token(t, "shop", "other")
	for _, tc := range []struct {
		name string
		tok  string
		req  *workloadpb.JWTSVIDRequest
		want codes.Code
	}{
		{"no token", "", &workloadpb.JWTSVIDRequest{Audience: []string{"a"}}, codes.Unauthenticated},
		{"forged token", tok[:len(tok)-4] + "AAAA", &workloadpb.JWTSVIDRequest{Audience: []string{"a"}}, codes.Unauthenticated},
		{"another identity", tok, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}, SpiffeId: sid("kube-system", "admin").String()}, codes.PermissionDenied},
		{"huge spiffe_id", tok, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}, SpiffeId: strings.Repeat("x", 4096)}, codes.InvalidArgument},
		{"no audience", tok, &workloadpb.JWTSVIDRequest{}, codes.InvalidArgument},
		{"huge audience", tok, &workloadpb.JWTSVIDRequest{Audience: []string{strings.Repeat("a", 100<<10)}}, codes.InvalidArgument},
		{"too many audiences", tok, &workloadpb.JWTSVIDRequest{Audience: make([]string, 1000)}, codes.InvalidArgument},
		{"first of other", other, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}}, codes.OK},
		{"rate limited", other, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}}, codes.ResourceExhausted},
	} {
		ctx := t.Context()
		if tc.tok != "" {
			ctx = withToken(ctx, tc.tok)
		}
		_, err := c.MintJWTSVID(ctx, tc.req)
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: code %s (%v), want %s", tc.name, got, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), tc.tok+"x") {
			t.Errorf("%s: the error quotes the token", tc.name)
		}
	}
}

// A CA without a JWT issuer does not serve the service.
func TestJWTServiceOffWithoutIssuer(t *testing.T) {
	e := newEnv(t, envOpts{})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: e.pool(), ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = jwtapi.NewClient(conn).FetchJWTBundles(t.Context(), &workloadpb.JWTBundlesRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("err = %v, want Unimplemented", err)
	}
}

// TestMintJWTSVIDSpiffeIDLimits: a spiffe_id of up to 2048 bytes (the
// SPIFFE ID limit) is read and, naming another identity, refused with
// PermissionDenied; a longer one is InvalidArgument. The refusal quotes
// the requested ID whole up to 128 bytes, and clipped after.
func TestMintJWTSVIDSpiffeIDLimits(t *testing.T) {
	e, c := jwtEnv(t, nil)
	ctx := withToken(t.Context(), e.token(t, "shop", "cart"))
	id := func(n int) string {
		prefix := "spiffe://cluster.local/ns/shop/sa/"
		return prefix + strings.Repeat("a", n-len(prefix))
	}
	for _, tc := range []struct {
		id   string
		want codes.Code
		msg  string // in the message
	}{
		{id(128), codes.PermissionDenied, `, not "` + id(128) + `"`},
		{id(129), codes.PermissionDenied, `, not "` + id(129)[:128] + `..."`},
		{id(certservice.MaxImpersonatedIdentity), codes.PermissionDenied, `, not "` + id(128) + `..."`},
		{id(certservice.MaxImpersonatedIdentity + 1), codes.InvalidArgument, "2049 bytes, more than the 2048-byte limit"},
	} {
		_, err := c.MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}, SpiffeId: tc.id})
		if st := status.Convert(err); st.Code() != tc.want || !strings.Contains(st.Message(), tc.msg) {
			t.Errorf("spiffe_id of %d bytes: %v %q, want %v with %q", len(tc.id), st.Code(), st.Message(), tc.want, tc.msg)
		}
	}
}

// TestJWTSVIDNeverOutlivesItsCredential reproduces issue 28, hole 4 on the
// real server: a JWT-SVID (5-minute TTL) minted on a token with 2 minutes
// left, or on a client certificate with 2 minutes left, expires with that
// credential, as the X.509 renewal rule caps a leaf (ca.Credential.Cap);
// a token already expired but within the authenticator's 30 s clock-skew
// leeway is Unauthenticated, naming the expiry. On c30f24e both tokens
// expired at now + TTL, and the expired token got one.
func TestJWTSVIDNeverOutlivesItsCredential(t *testing.T) {
	e, c := jwtEnv(t, nil)
	mint := func(ctx context.Context) (*jwtsvid.SVID, error) {
		t.Helper()
		resp, err := c.MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"orders"}})
		if err != nil {
			return nil, err
		}
		bundles, err := c.FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := jwtbundle.Parse(td, bundles.Bundles[td.IDString()])
		if err != nil {
			t.Fatal(err)
		}
		return jwtsvid.ParseAndValidate(resp.Svids[0].Svid, b, []string{"orders"})
	}
	const left = 2 * time.Minute // less than the 5-minute TTL

	now := time.Now()
	tok, err := e.issuer.Mint("shop", "cart", []string{"istio-ca"}, left, now)
	if err != nil {
		t.Fatal(err)
	}
	svid, err := mint(withToken(t.Context(), tok))
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(left).Truncate(time.Second); !svid.Expiry.Equal(want) {
		t.Errorf("token with %v left: JWT-SVID expires %s, want the token's exp %s", left, svid.Expiry, want)
	}

	expired, err := e.issuer.Mint("shop", "cart", []string{"istio-ca"}, time.Minute, now.Add(-time.Minute-10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = mint(withToken(t.Context(), expired))
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "the token expired at") {
		t.Errorf("token expired 10 s ago (within the leeway): %v, want Unauthenticated naming the expiry", err)
	}

	// A client certificate with 2 minutes left, proved by a token.
	key := testkit.Key(t, certs.ECP256)
	resp, err := e.client(t, "localhost", nil).CreateCertificate(withToken(t.Context(), e.token(t, "shop", "cart")),
		&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, key, sid("shop", "cart"), nil), ValidityDuration: int64(left / time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	leaf := verifyChain(t, resp.CertChain, e.authority.Bundle().Roots, 0, sid("shop", "cart").String())
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: e.pool(), ServerName: "localhost",
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}},
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c = jwtapi.NewClient(conn)
	svid, err = mint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !svid.Expiry.Equal(leaf.NotAfter) {
		t.Errorf("client certificate with %v left: JWT-SVID expires %s, want the certificate's NotAfter %s", left, svid.Expiry, leaf.NotAfter)
	}
}

// leavingAuth authenticates a caller only once the caller has gone: a
// TokenReview that answers after the client gave up.
type leavingAuth struct {
	entered chan struct{}
	next    authn.Authenticator
}

func (l leavingAuth) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	l.entered <- struct{}{}
	<-ctx.Done()
	return l.next.Authenticate(context.WithoutCancel(ctx), creds)
}

// TestNothingSignedForACallerThatLeft: a caller that gives up while its
// credentials are being reviewed gets neither a JWT-SVID nor a certificate
// minted for nobody (the agent's cancelled JWT flights must not turn into
// CA work).
func TestNothingSignedForACallerThatLeft(t *testing.T) {
	reg := prometheus.NewRegistry()
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	gate := leavingAuth{entered: make(chan struct{})}
	e := newEnv(t, envOpts{
		cfg:   func(c *certservice.Config) { c.JWT = iss },
		caCfg: func(c *ca.Config) { c.Registerer = reg },
		auths: func(e *env) []authn.Authenticator {
			gate.next = e.srvAuth(t)
			return []authn.Authenticator{gate}
		},
	})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: e.pool(), ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	jc, cc := jwtapi.NewClient(conn), securityv1alpha1.NewIstioCertificateServiceClient(conn)
	served := testkit.Metric(t, reg, "meshid_ca_certificates_issued_total") // the CA's own serving certificate
	token := e.token(t, "shop", "cart")
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
	calls := map[string]func(context.Context) error{
		"MintJWTSVID": func(ctx context.Context) error {
			_, err := jc.MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"orders"}})
			return err
		},
		"CreateCertificate": func(ctx context.Context) error {
			_, err := cc.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: string(csr)})
			return err
		},
	}
	for name, call := range calls {
		ctx, cancel := context.WithCancel(withToken(t.Context(), token))
		done := make(chan error, 1)
		go func() { done <- call(ctx) }()
		<-gate.entered
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Errorf("%s: %v, want Canceled", name, err)
		}
	}
	// Stopping the server waits for its handlers (GracefulStop), so the
	// counters below include whatever the cancelled calls went on to do.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	if n := testkit.Metric(t, reg, "meshid_ca_jwtsvid_issued_total"); n != 0 {
		t.Errorf("%v JWT-SVIDs minted for callers that left, want 0", n)
	}
	if n := testkit.Metric(t, reg, "meshid_ca_certificates_issued_total") - served; n != 0 {
		t.Errorf("%v certificates signed for callers that left, want 0", n)
	}
}
