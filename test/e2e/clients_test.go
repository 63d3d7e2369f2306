package e2e_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/testkit"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// secretTypeURL is the xDS type of SDS resources, from the generated message.
var secretTypeURL = testkit.SecretTypeURL

func mustID(t testing.TB, ns, sa string) spiffeid.ID {
	t.Helper()
	id, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// ---- The Istio CSR API, as istio-agent calls it ----

// istioClient dials the CA at addr over TLS verified with the roots in
// rootFile. serverName "" verifies the host of addr.
func istioClient(t testing.TB, addr, serverName, rootFile string) securityv1alpha1.IstioCertificateServiceClient {
	t.Helper()
	data, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		t.Fatalf("%s holds no certificate", rootFile)
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(conn)
}

// istioCSR returns a key and a PEM CSR shaped like istio-agent's: a subject
// with one empty Organization and the SPIFFE ID as the only URI SAN.
func istioCSR(t testing.TB, id spiffeid.ID) (crypto.Signer, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key, istioCSRFor(t, id, key)
}

// istioCSRFor is istioCSR with a given key.
func istioCSRFor(t testing.TB, id spiffeid.ID, key crypto.Signer) string {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{Organization: []string{""}},
		URIs:    []*url.URL{id.URL()},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// createCertificate sends csr with the bearer token (none when empty) and
// the metadata istio-agent sends.
func createCertificate(t testing.TB, c securityv1alpha1.IstioCertificateServiceClient, csr, token string) (*securityv1alpha1.IstioCertificateResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	md, err := structpb.NewStruct(map[string]any{"ClusterID": "Kubernetes", "CertSigner": ""})
	if err != nil {
		t.Fatal(err)
	}
	return c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
		Csr:              csr,
		ValidityDuration: int64(time.Hour / time.Second),
		Metadata:         md,
	})
}

// verifyIstioChain checks a CreateCertificate cert_chain (leaf, each
// intermediate, root bundle last) against the roots in rootFile, with
// crypto/x509 and with go-spiffe, and returns the leaf and intermediates.
func verifyIstioChain(t testing.TB, chain []string, rootFile string, key crypto.Signer, want spiffeid.ID) (*x509.Certificate, []*x509.Certificate) {
	t.Helper()
	if len(chain) < 2 {
		t.Fatalf("cert_chain has %d elements, want leaf ... root bundle", len(chain))
	}
	rootPEM, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := parseCerts(t, []byte(chain[len(chain)-1])); !sameCerts(got, parseCerts(t, rootPEM)) {
		t.Fatalf("the last cert_chain element is not the root bundle of %s", rootFile)
	}
	var leafAndInter [][]byte
	var inter []*x509.Certificate
	for i, p := range chain[:len(chain)-1] {
		cs := parseCerts(t, []byte(p))
		if len(cs) != 1 {
			t.Fatalf("cert_chain[%d] holds %d certificates, want 1", i, len(cs))
		}
		leafAndInter = append(leafAndInter, cs[0].Raw)
		if i > 0 {
			inter = append(inter, cs[0])
		}
	}
	leaf, err := x509.ParseCertificate(leafAndInter[0])
	if err != nil {
		t.Fatal(err)
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(rootPEM)
	ipool := x509.NewCertPool()
	for _, c := range inter {
		ipool.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: ipool,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}); err != nil {
		t.Fatalf("x509.Verify against %s: %v", rootFile, err)
	}
	bundle, err := x509bundle.Load(td, rootFile)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := x509svid.ParseAndVerify(leafAndInter, bundle)
	if err != nil {
		t.Fatalf("x509svid.ParseAndVerify: %v", err)
	}
	if id != want {
		t.Fatalf("SPIFFE ID %s, want %s", id, want)
	}
	if pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		t.Fatal("the leaf does not certify the CSR's key")
	}
	// The workload leaf profile, as Envoy and Istio use it.
	wantKU := x509.KeyUsageDigitalSignature
	if _, ok := key.(*rsa.PrivateKey); ok {
		wantKU |= x509.KeyUsageKeyEncipherment
	}
	if leaf.IsCA || leaf.KeyUsage != wantKU || len(leaf.Subject.Names) != 0 ||
		!slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Fatalf("leaf profile: CA=%v KeyUsage=%v EKU=%v subject=%q", leaf.IsCA, leaf.KeyUsage, leaf.ExtKeyUsage, leaf.Subject)
	}
	return leaf, inter
}

func parseCerts(t testing.TB, data []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			t.Fatalf("unexpected PEM block %q", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		t.Fatal("no certificate in PEM data")
	}
	return out
}

func sameCerts(a, b []*x509.Certificate) bool {
	return slices.EqualFunc(a, b, (*x509.Certificate).Equal)
}

func pemCerts(cs ...*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range cs {
		pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

// ---- SDS, as Envoy speaks it ----

// sdsClient dials the SDS server on a Unix socket.
func sdsClient(t testing.TB, sock string) secretv3.SecretDiscoveryServiceClient {
	t.Helper()
	return secretv3.NewSecretDiscoveryServiceClient(testkit.DialUnix(t, sock))
}

// waitSDS polls the socket until FetchSecrets returns default and ROOTCA.
func waitSDS(t testing.TB, sock string) {
	t.Helper()
	c := sdsClient(t, sock)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(guard)
	defer deadline.Stop()
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{
			TypeUrl: secretTypeURL, ResourceNames: []string{"default", "ROOTCA"},
		})
		cancel()
		if err == nil {
			return
		}
		last = err
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("SDS on %s did not answer within %v: %v", sock, guard, last)
		}
	}
}

// sotw is a StreamSecrets stream driven the way Envoy drives it.
type sotw struct {
	t       testing.TB
	s       grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	names   []string
	nonce   string
	version string
}

// openSotw opens a stream and subscribes to names.
func openSotw(t testing.TB, c secretv3.SecretDiscoveryServiceClient, names ...string) *sotw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	t.Cleanup(cancel)
	s, err := c.StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := &sotw{t: t, s: s, names: names}
	st.send(&corev3.Node{Id: "sidecar~10.0.0.1~e2e.default~default.svc.cluster.local", Cluster: "e2e"})
	return st
}

func (s *sotw) send(node *corev3.Node) {
	s.t.Helper()
	if err := s.s.Send(&discoveryv3.DiscoveryRequest{
		Node: node, TypeUrl: secretTypeURL, ResourceNames: s.names,
		VersionInfo: s.version, ResponseNonce: s.nonce,
	}); err != nil {
		s.t.Fatalf("send: %v", err)
	}
}

// recv returns the secrets of the next response and ACKs it.
func (s *sotw) recv() []*tlsv3.Secret {
	s.t.Helper()
	r, err := s.s.Recv()
	if err != nil {
		s.t.Fatalf("recv: %v", err)
	}
	if r.GetTypeUrl() != secretTypeURL || r.GetNonce() == "" || r.GetVersionInfo() == "" {
		s.t.Fatalf("malformed response: %v", r)
	}
	s.nonce, s.version = r.GetNonce(), r.GetVersionInfo()
	out := make([]*tlsv3.Secret, 0, len(r.GetResources()))
	for _, a := range r.GetResources() {
		sec := &tlsv3.Secret{}
		if a.GetTypeUrl() != secretTypeURL {
			s.t.Fatalf("resource type %q", a.GetTypeUrl())
		}
		if err := a.UnmarshalTo(sec); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, sec)
	}
	s.send(nil) // ACK
	return out
}

// secretNames lists the names of secs, for failure messages (empty when secs is).
func secretNames(secs []*tlsv3.Secret) []string {
	out := make([]string, len(secs))
	for i, s := range secs {
		out[i] = s.GetName()
	}
	return out
}

// recvNames receives responses until each of names has arrived.
func (s *sotw) recvNames(names ...string) map[string]*tlsv3.Secret {
	s.t.Helper()
	got := map[string]*tlsv3.Secret{}
	for len(got) < len(names) {
		for _, sec := range s.recv() {
			got[sec.GetName()] = sec
		}
	}
	for _, n := range names {
		if got[n] == nil {
			s.t.Fatalf("did not receive %q (got %v)", n, got)
		}
	}
	return got
}

// svidOf parses a TlsCertificate secret with go-spiffe, which checks that
// the leaf is an X509-SVID and that the key matches it.
func svidOf(t testing.TB, s *tlsv3.Secret) *x509svid.SVID {
	t.Helper()
	tc := s.GetTlsCertificate()
	if tc == nil {
		t.Fatalf("secret %q is not a TlsCertificate", s.GetName())
	}
	svid, err := x509svid.Parse(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		t.Fatalf("secret %q: %v", s.GetName(), err)
	}
	return svid
}

// bundleOf parses a validation-context secret's trusted_ca.
func bundleOf(t testing.TB, s *tlsv3.Secret) *x509bundle.Bundle {
	t.Helper()
	vc := s.GetValidationContext()
	if vc == nil || len(vc.GetTrustedCa().GetInlineBytes()) == 0 {
		t.Fatalf("secret %q has no trusted_ca", s.GetName())
	}
	b, err := x509bundle.Parse(td, vc.GetTrustedCa().GetInlineBytes())
	if err != nil {
		t.Fatalf("secret %q: %v", s.GetName(), err)
	}
	return b
}

// verifySVID verifies svid against bundle at now (zero: the real time) and
// checks its SPIFFE ID.
func verifySVID(t testing.TB, svid *x509svid.SVID, bundle *x509bundle.Bundle, now time.Time, want spiffeid.ID) {
	t.Helper()
	var opts []x509svid.VerifyOption
	if !now.IsZero() {
		opts = append(opts, x509svid.WithTime(now))
	}
	id, _, err := x509svid.Verify(svid.Certificates, bundle, opts...)
	if err != nil {
		t.Fatalf("served chain does not verify: %v", err)
	}
	if id != want || svid.ID != want {
		t.Fatalf("SPIFFE ID %s, want %s", id, want)
	}
}
