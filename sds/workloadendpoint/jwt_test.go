package workloadendpoint_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/workloadendpoint"
	"github.com/meshid/meshid/testkit"
)

// TestJWTSVIDAcrossAgentsRealCA: the CA and two agents as the binaries run
// them (caserver, agent assemblies, real TLS and Unix sockets); go-spiffe v2
// clients unchanged. A JWT-SVID fetched from one agent validates through
// ValidateJWTSVID on the other and with jwtsvid.ParseAndValidate against
// the bundle of a JWTSource; the wrong audience and another identity are
// refused.
func TestJWTSVIDAcrossAgentsRealCA(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://meshid.test")
	if err != nil {
		t.Fatal(err)
	}
	ca := testkit.CA(t, caserver.Config{StateDir: dir, Authn: caserver.AuthnConfig{JWTIssuer: iss.Issuer(), JWKSFile: filepath.Join(dir, devissuer.JWKSFile)}})
	startAgent := func(sa string) string {
		tok, err := iss.Mint("default", sa, []string{"istio-ca"}, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		tokenFile := filepath.Join(dir, sa+".token")
		if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(testkit.ShortDir(t), "wl.sock")
		testkit.RunAgent(t, agent.Config{CAAddr: ca.Addr().String(), CARootFile: filepath.Join(dir, "root-cert.pem"), TokenFile: tokenFile, WorkloadAPISocket: sock})
		return "unix://" + sock
	}
	front, back := startAgent("front"), startAgent("back")
	frontID := spiffeid.RequireFromPath(td, "/ns/default/sa/front")
	ctx := guardCtx(t)

	src, err := workloadapi.NewJWTSource(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(front)))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	svid, err := src.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != frontID {
		t.Fatalf("JWT-SVID for %s", svid.ID)
	}
	got, err := workloadapi.ValidateJWTSVID(ctx, svid.Marshal(), "orders", workloadapi.WithAddr(back))
	if err != nil || got.ID != frontID {
		t.Fatalf("ValidateJWTSVID on the other agent: %v, %v", got, err)
	}
	if _, err := jwtsvid.ParseAndValidate(svid.Marshal(), src, []string{"orders"}); err != nil {
		t.Fatalf("ParseAndValidate against the fetched bundle: %v", err)
	}
	if _, err := workloadapi.ValidateJWTSVID(ctx, svid.Marshal(), "payments", workloadapi.WithAddr(back)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("wrong audience: %v, want InvalidArgument", err)
	}
	backID := spiffeid.RequireFromPath(td, "/ns/default/sa/back")
	if _, err := workloadapi.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "orders", Subject: backID}, workloadapi.WithAddr(front)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another identity's JWT-SVID: %v, want PermissionDenied", err)
	}
}

// jwtAgent is newAgent with a JWT signer: a jwtissuer on the agent's fake
// clock.
func jwtAgent(t *testing.T) (*testAgent, *jwtissuer.Issuer) {
	t.Helper()
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	authority := testkit.NewAuthority(t, td, clk, nil)
	id := spiffeid.RequireFromPath(td, "/ns/default/sa/app")
	m, err := secretcache.New(secretcache.Config{
		Signer: testkit.AuthoritySigner{Authority: authority}, JWTSigner: testkit.JWTSigner{Issuer: iss},
		ID: id, TTL: ttl, Jitter: -1, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := workloadendpoint.New(workloadendpoint.Config{Source: m, SocketPath: filepath.Join(testkit.ShortDir(t), "workload.sock"), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "agent", m.Run, srv.Run)
	return &testAgent{clock: clk, m: m, srv: srv, path: srv.SocketPath(), id: id}, iss
}

// TestJWTAttacks: what a hostile local client can send.
func TestJWTAttacks(t *testing.T) {
	a, _ := jwtAgent(t)
	c := raw(t, a.path)
	ctx := withHeader(guardCtx(t))
	// 10,000 distinct audiences: the cache stays at its bound. Each request
	// has its own guard (a hang fails it), not one guard for all 10,000,
	// which a loaded 2-core machine can exceed without anything being wrong.
	for n := range 10_000 {
		rctx, cancel := context.WithTimeout(withHeader(context.Background()), testkit.Guard)
		_, err := c.FetchJWTSVID(rctx, &workloadpb.JWTSVIDRequest{Audience: []string{fmt.Sprint("aud-", n)}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := a.m.JWTSVIDsCached(); n > secretcache.DefaultMaxJWTSVIDs {
		t.Errorf("%d JWT-SVIDs cached after 10,000 audiences", n)
	}
	for name, req := range map[string]*workloadpb.JWTSVIDRequest{
		"no audience":    {},
		"huge audience":  {Audience: []string{strings.Repeat("a", 60<<10)}},
		"many audiences": {Audience: strings.Split(strings.Repeat("a,", 1000), ",")},
	} {
		if _, err := c.FetchJWTSVID(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	other := spiffeid.RequireFromPath(td, "/ns/kube-system/sa/admin")
	if _, err := c.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}, SpiffeId: other.String()}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another identity: %v, want PermissionDenied", err)
	}
	// No workload.spiffe.io metadata: InvalidArgument for every JWT method.
	bare := guardCtx(t)
	if _, err := c.FetchJWTSVID(bare, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("FetchJWTSVID without metadata: %v", err)
	}
	if s, err := c.FetchJWTBundles(bare, &workloadpb.JWTBundlesRequest{}); err == nil {
		if _, err = s.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("FetchJWTBundles without metadata: %v", err)
		}
	}
	if _, err := c.ValidateJWTSVID(bare, &workloadpb.ValidateJWTSVIDRequest{Audience: "a", Svid: "x"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ValidateJWTSVID without metadata: %v", err)
	}
	// A forged token: the real key ID and claims, another key's signature.
	resp, err := c.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"orders"}})
	if err != nil {
		t.Fatal(err)
	}
	real := resp.Svids[0].Svid
	for name, req := range map[string]*workloadpb.ValidateJWTSVIDRequest{
		"forged":      {Audience: "orders", Svid: forge(t, real)},
		"garbage":     {Audience: "orders", Svid: "a.b.c"},
		"no audience": {Svid: real},
		"no svid":     {Audience: "orders"},
		"wrong aud":   {Audience: "payments", Svid: real},
	} {
		if _, err := c.ValidateJWTSVID(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ValidateJWTSVID %s: %v, want InvalidArgument", name, err)
		}
	}
	ok, err := c.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "orders", Svid: real})
	if err != nil || ok.SpiffeId != a.id.String() || ok.Claims.Fields["sub"].GetStringValue() != a.id.String() {
		t.Fatalf("the real token: %v, %v", ok, err)
	}
	// Expiry on the fake clock.
	a.clock.Add(jwtissuer.DefaultTTL + time.Minute + time.Second)
	if _, err := c.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "orders", Svid: real}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("expired: %v, want InvalidArgument", err)
	}
}

// forge re-signs token's header key ID and claims with a fresh key.
func forge(t *testing.T, token string) string {
	t.Helper()
	parsed, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{}
	if err := parsed.UnsafeClaimsWithoutVerification(&claims); err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: testkit.Key(t, certs.ECP256)},
		(&jose.SignerOptions{}).WithHeader("kid", parsed.Headers[0].KeyID))
	if err != nil {
		t.Fatal(err)
	}
	out, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestJWTBundlesPushedOnChange: the FetchJWTBundles stream sends the
// bundle, then again when the CA's key rotation reaches the agent's
// refresh.
func TestJWTBundlesPushedOnChange(t *testing.T) {
	a, _ := jwtAgent(t)
	s, err := raw(t, a.path).FetchJWTBundles(withHeader(guardCtx(t)), &workloadpb.JWTBundlesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Bundles[td.IDString()]) == 0 {
		t.Fatalf("bundles %v", first.Bundles)
	}
	// The refresh timer and the certificate scheduler are parked.
	guard := make(chan struct{})
	timer := time.AfterFunc(testkit.Guard, func() { close(guard) })
	defer timer.Stop()
	if !a.clock.WaitForWaiters(1, guard) {
		t.Fatal("the JWT bundle refresh did not park")
	}
	a.clock.Add(jwtissuer.DefaultKeyLifetime)
	second, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if string(second.Bundles[td.IDString()]) == string(first.Bundles[td.IDString()]) {
		t.Error("the same bundle was pushed again")
	}
}

// An agent whose CA client cannot mint JWT-SVIDs answers Unavailable, which
// go-spiffe's clients retry.
func TestJWTUnavailableWithoutJWTSigner(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	c := raw(t, a.path)
	ctx := withHeader(guardCtx(t))
	if _, err := c.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"a"}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("FetchJWTSVID: %v", err)
	}
	if _, err := c.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "a", Svid: "x"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ValidateJWTSVID: %v", err)
	}
	s, err := c.FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("FetchJWTBundles: %v", err)
	}
}
