package caserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/testkit"
)

// TestUnauthenticatedCallsDoNotHoldConnectionSlots reproduces issue 28,
// hole 2 on the assembly `meshid server` runs, with --max-connections 20:
// 20 connections that each make one call without credentials (a
// CreateCertificate without a token, or a FetchJWTBundles) fill every
// slot, and a new client is refused. At the first-request timeout (on
// the injected clock) all 20 are closed, and the new client gets its
// certificate. On c30f24e one unauthenticated call marked a connection
// served: the 20 stayed open (until the 15-minute idle limit) and the
// new client stayed refused.
func TestUnauthenticatedCallsDoNotHoldConnectionSlots(t *testing.T) {
	const slots = 20
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	reg := prometheus.NewRegistry()
	s := testkit.CA(t, caserver.Config{
		TrustDomain: exampleTD,
		StateDir:    dir,
		Authn: caserver.AuthnConfig{
			JWTIssuer: iss.Issuer(),
			JWKSFile:  filepath.Join(dir, devissuer.JWKSFile),
		},
		Limits: caserver.LimitsConfig{
			MaxConnections: slots,
		},
		Clock:      clk,
		Registerer: reg,
	})
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard) // a safety bound only
	defer cancel()
	roots := x509.NewCertPool()
	for _, r := range s.Authority().Bundle().Roots {
		roots.AddCert(r)
	}
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient(s.Addr().String(), append([]grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost"})),
		}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	id := spiffeid.RequireFromSegments(exampleTD, "ns", "shop", "sa", "cart")
	csr := string(testkit.CSRPEM(t, testkit.Key(t, certs.ECP256), id))

	attackers := make([]*grpc.ClientConn, slots)
	for i := range attackers {
		attackers[i] = dial()
		if i%2 == 1 { // the public bundle: served without credentials
			if _, err := jwtapi.NewClient(attackers[i]).FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{}); err != nil {
				t.Fatalf("attacker %d: FetchJWTBundles: %v", i, err)
			}
			continue
		}
		_, err := securityv1alpha1.NewIstioCertificateServiceClient(attackers[i]).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("attacker %d: CreateCertificate without a token: %v, want Unauthenticated", i, err)
		}
	}
	if n := testkit.Metric(t, reg, "meshid_ca_connections_open"); n != slots {
		t.Fatalf("open connections = %v, want %d", n, slots)
	}

	// The newcomer retries quickly (gRPC's default backoff grows to
	// 2 minutes of real time with every refusal).
	newcomer := securityv1alpha1.NewIstioCertificateServiceClient(dial(grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
		MinConnectTimeout: 20 * time.Second,
	})))
	tok, err := iss.Mint("shop", "cart", []string{"istio-ca"}, time.Hour, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	authCtx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	if _, err := newcomer.CreateCertificate(authCtx, &securityv1alpha1.IstioCertificateRequest{Csr: csr}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a new client while every slot is held: %v, want Unavailable", err)
	}
	if n := testkit.Metric(t, reg, "meshid_ca_connections_refused_total", "reason", "limit"); n < 1 {
		t.Fatalf("limit refusals = %v", n)
	}

	// Each attacker's first-request timer was set when its connection
	// was accepted, before its call returned.
	clk.Add(certservice.DefaultFirstRequestTimeout)
	for i, conn := range attackers {
		if !conn.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatalf("attacker %d: still connected after the first-request timeout", i)
		}
	}
	if n := testkit.Metric(t, reg, "meshid_ca_connections_refused_total", "reason", "first_request_timeout"); n != slots {
		t.Fatalf("first_request_timeout closes = %v, want %d", n, slots)
	}
	resp, err := newcomer.CreateCertificate(authCtx, &securityv1alpha1.IstioCertificateRequest{Csr: csr}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("a new client after the attackers' connections closed: %v", err)
	}
	leaf, err := certs.ParseCertificates([]byte(resp.CertChain[0]))
	if err != nil || leaf[0].URIs[0].String() != id.String() {
		t.Fatalf("issued %v (%v), want a leaf for %s", leaf, err, id)
	}
}
