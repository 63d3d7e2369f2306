package devstack_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/devstack"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/sdsfetch"
	"github.com/meshid/meshid/testkit"
)

// The built-in agent of `meshid dev --listen 0.0.0.0:PORT` (a container)
// dials the CA where its serving certificate is valid: 127.0.0.1, not the
// unspecified address.
func TestDialAddr(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want string
	}{
		{"0.0.0.0", "127.0.0.1:15012"},
		{"::", "127.0.0.1:15012"},
		{"127.0.0.1", "127.0.0.1:15012"},
		{"10.1.2.3", "10.1.2.3:15012"},
		{"::1", "[::1]:15012"},
	} {
		if got := devstack.DialAddr(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 15012}); got != tc.want {
			t.Errorf("DialAddr(%s) = %s, want %s", tc.ip, got, tc.want)
		}
	}
}

// The stack's agent obtains default/default's certificate from the stack's
// CA with the token the stack wrote, and serves it over SDS; the token is
// re-minted at half its lifetime.
func TestStack(t *testing.T) {
	dir := testkit.ShortDir(t)
	clk := clock.NewFake(time.Now())
	dev, err := devstack.New(devstack.Config{StateDir: dir, Listen: "127.0.0.1:0", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Listen(); err != nil {
		t.Fatal(err)
	}
	// The banner shows both sockets the agent serves, and how to read each.
	var banner strings.Builder
	dev.Banner(&banner, "meshid")
	for _, want := range []string{
		"SDS socket (Envoy)           " + filepath.Join(dir, devstack.SDSSocket),
		"Workload API socket (SPIFFE) " + filepath.Join(dir, devstack.WorkloadSocket),
		"meshid inspect --workload-api " + filepath.Join(dir, devstack.WorkloadSocket),
	} {
		if !strings.Contains(banner.String(), want) {
			t.Errorf("banner lacks %q:\n%s", want, banner.String())
		}
	}
	testkit.Run(t, "dev", dev.Run)

	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	secrets, err := sdsfetch.Fetch(ctx, sdsfetch.Config{Socket: filepath.Join(dir, devstack.SDSSocket), Names: []string{"default"}})
	if err != nil {
		t.Fatal(err)
	}
	leaf := secrets[0].Chain[0]
	if got := leaf.URIs[0].String(); got != "spiffe://cluster.local/ns/default/sa/default" {
		t.Errorf("leaf ID = %s", got)
	}
	roots := testkit.ReadCerts(t, filepath.Join(dir, "root-cert.pem"))
	pool := x509.NewCertPool()
	pool.AddCert(roots[0])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("leaf does not verify to root-cert.pem: %v", err)
	}

	tokenFile := filepath.Join(dir, devstack.TokenFile)
	before, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	if d := testkit.NextDeadline(t, clk, "token refresh"); !d.Equal(start.Add(devstack.TokenTTL / 2)) {
		t.Fatalf("token refresh at %v, want half of %v", d.Sub(start), devstack.TokenTTL)
	}
	clk.Add(devstack.TokenTTL / 2)
	// The next deadline is set once the token is written.
	testkit.NextDeadline(t, clk, "next token refresh")
	after, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) == string(before) {
		t.Error("token not re-minted at half its lifetime")
	}
}

// Token mints for the identity, audience and lifetime asked, with the
// issuer of the stack's state directory: the JWKS the stack's CA trusts
// verifies it.
func TestToken(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, devissuer.DefaultIssuer) // what meshid dev does
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tok, err := devstack.Token(devstack.TokenRequest{StateDir: dir, Namespace: "shop", ServiceAccount: "cart", Audience: "aud", TTL: time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	c := verifiedClaims(t, tok, iss)
	if sa, _ := c.ServiceAccount(); sa != (identity.ServiceAccount{Namespace: "shop", Name: "cart"}) || c.Issuer != devissuer.DefaultIssuer || !c.Audience.Contains("aud") || !c.Expiry.Time().Equal(now.Add(time.Hour)) {
		t.Fatalf("claims %+v", c)
	}
}

// A state directory without an issuer (a typo, a meshid dev never run) is
// refused with the command that creates one, and nothing is written: a new
// issuer's token would be trusted by no running CA.
func TestTokenNoIssuer(t *testing.T) {
	parent := t.TempDir()
	for _, dir := range []string{parent, filepath.Join(parent, "typo")} {
		_, err := devstack.Token(devstack.TokenRequest{StateDir: dir, Namespace: "a", ServiceAccount: "b", Audience: "aud", TTL: time.Hour}, time.Now())
		if !errors.Is(err, devstack.ErrNoIssuer) || !strings.Contains(err.Error(), "meshid dev --state-dir "+dir) {
			t.Fatalf("Token(%s) = %v, want ErrNoIssuer naming `meshid dev --state-dir %s`", dir, err, dir)
		}
	}
	if entries, err := os.ReadDir(parent); err != nil || len(entries) != 0 {
		t.Fatalf("Token wrote into the state dir: %v %v", entries, err)
	}
	// --create-issuer: the issuer is created, and the next token is signed
	// by the same key.
	dir := filepath.Join(parent, "server")
	r := devstack.TokenRequest{StateDir: dir, CreateIssuer: true, Namespace: "a", ServiceAccount: "b", Audience: "aud", TTL: time.Hour}
	if _, err := devstack.Token(r, time.Now()); err != nil {
		t.Fatal(err)
	}
	iss, err := devissuer.Load(dir, devissuer.DefaultIssuer)
	if err != nil {
		t.Fatalf("--create-issuer left no issuer: %v", err)
	}
	r.CreateIssuer = false
	tok, err := devstack.Token(r, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	verifiedClaims(t, tok, iss)
}

// verifiedClaims are tok's claims, verified with iss's key.
func verifiedClaims(t *testing.T, tok string, iss *devissuer.Issuer) identity.Claims {
	t.Helper()
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	var c identity.Claims
	if err := parsed.Claims(iss.JWKS().Keys[0].Key, &c); err != nil {
		t.Fatalf("the issuer's key does not verify the token: %v", err)
	}
	return c
}
