package e2e_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/internal/devissuer"
)

// Issue 2, done when: a CSR sent with the generated Istio client and a
// `meshid dev token` comes back as a chain that verifies to root-cert.pem
// with the right SPIFFE ID; and the error codes hold through the binary.
func TestDevCAIssuesToIstioClient(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	_, port, err := net.SplitHostPort(d.caAddr)
	if err != nil {
		t.Fatal(err)
	}
	clients := []struct {
		name string
		c    securityv1alpha1.IstioCertificateServiceClient
		key  crypto.Signer // nil: a fresh P-256 key
	}{
		// istio-agent with CA_ADDR=localhost:<port> verifies the serving
		// certificate as istiod.istio-system.svc.
		{"CA_ADDR=localhost", istioClient(t, net.JoinHostPort("localhost", port), "istiod.istio-system.svc", d.root), nil},
		// A client dialing the printed address verifies its IP SAN.
		{"printed address", istioClient(t, d.caAddr, "", d.root), nil},
	}
	cart := mustID(t, "shop", "cart")
	token := d.token(t, "shop", "cart")

	// istio-agent's default workload key is RSA-2048.
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range append(clients, struct {
		name string
		c    securityv1alpha1.IstioCertificateServiceClient
		key  crypto.Signer
	}{"CA_ADDR=localhost, RSA-2048 key", clients[0].c, rsaKey}) {
		t.Run(tc.name, func(t *testing.T) {
			key, csr := istioCSR(t, cart)
			if tc.key != nil {
				key, csr = tc.key, istioCSRFor(t, cart, tc.key)
			}
			before := time.Now()
			resp, err := createCertificate(t, tc.c, csr, token)
			if err != nil {
				t.Fatalf("CreateCertificate: %v", err)
			}
			leaf, inter := verifyIstioChain(t, resp.GetCertChain(), d.root, key, cart)
			if len(inter) != 0 {
				t.Fatalf("dev's self-signed root signs leaves directly, but the chain has %d intermediates", len(inter))
			}
			// validity_duration was one hour.
			if lo, hi := before.Add(time.Hour-time.Minute), time.Now().Add(time.Hour+time.Minute); leaf.NotAfter.Before(lo) || leaf.NotAfter.After(hi) {
				t.Fatalf("NotAfter %v, want about an hour from now", leaf.NotAfter)
			}
		})
	}

	// A key the dev issuer never had signs a token that looks right.
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	forger, err := devissuer.New(otherKey, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	forged, err := forger.Mint("shop", "cart", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, cartCSR := istioCSR(t, cart)
	_, adminCSR := istioCSR(t, mustID(t, "shop", "admin"))

	for _, tc := range []struct {
		name       string
		csr, token string
		want       codes.Code
	}{
		{"no token", cartCSR, "", codes.Unauthenticated},
		{"wrong audience", cartCSR, d.token(t, "shop", "cart", "--audience", "other"), codes.Unauthenticated},
		{"token signed by another key", cartCSR, forged, codes.Unauthenticated},
		{"another service account's identity", adminCSR, token, codes.PermissionDenied},
		{"garbage CSR", "garbage", token, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := createCertificate(t, clients[0].c, tc.csr, tc.token)
			if status.Code(err) != tc.want {
				t.Fatalf("got %v (chain of %d), want %v", err, len(resp.GetCertChain()), tc.want)
			}
			msg := status.Convert(err).Message()
			if msg == "" {
				t.Fatal("the error says nothing about what is wrong")
			}
			if tc.token != "" && strings.Contains(msg, tc.token) {
				t.Fatal("the error message echoes the token")
			}
		})
	}
}
