package sdsserver_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"log/slog"
	"path/filepath"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

// harness is a running Server on a real Unix socket and a client of it.
type harness struct {
	srv    *sdsserver.Server
	reg    *prometheus.Registry
	logs   *testkit.LogRecorder
	path   string
	client secretv3.SecretDiscoveryServiceClient
	stop   func() // stops the server and closes the client
}

type harnessOpt func(*sdsserver.Config)

func withClock(c clock.Clock) harnessOpt { return func(cfg *sdsserver.Config) { cfg.Clock = c } }

// quiet discards the server's logs (for benchmarks).
func quiet(cfg *sdsserver.Config) { cfg.Logger = slog.New(slog.DiscardHandler) }

// start runs a Server over src until the test ends.
func start(t testing.TB, src sdsserver.Source, opts ...harnessOpt) *harness {
	t.Helper()
	h := startUntilStopped(t, src, opts...)
	t.Cleanup(h.stop)
	return h
}

// startUntilStopped runs a Server until h.stop is called.
func startUntilStopped(t testing.TB, src sdsserver.Source, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{reg: prometheus.NewRegistry(), logs: testkit.NewLogRecorder()}
	dir := testkit.ShortDir(t)
	h.path = filepath.Join(dir, "run", "sds.sock")
	cfg := sdsserver.Config{
		Source:     src,
		SocketPath: h.path,
		Logger:     slog.New(h.logs),
		Registerer: h.reg,
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := sdsserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	stopServer := testkit.Start(t, "sds server", srv.Run)
	conn := dialUntilClosed(t, h.path)
	h.client = secretv3.NewSecretDiscoveryServiceClient(conn)
	h.stop = func() {
		conn.Close()
		stopServer()
	}
	return h
}

func dial(t testing.TB, path string) *grpc.ClientConn { return testkit.DialUnix(t, path) }

func dialUntilClosed(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func (h *harness) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return testkit.Metric(t, h.reg, name, labels...)
}

// wantMetric reports an error unless the metric name (with labels) is
// want.
func (h *harness) wantMetric(t testing.TB, want float64, name string, labels ...string) {
	t.Helper()
	if n := h.metric(t, name, labels...); n != want {
		t.Errorf("%s%q = %v, want %v", name, labels, n, want)
	}
}

// sotwClient drives a StreamSecrets stream like Envoy does.
type sotwClient struct {
	t    testing.TB
	s    grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	node *corev3.Node
	sent bool

	names   []string
	nonce   string // of the latest response received
	version string // accepted version
}

// withDefault opens a stream on h, asks for default and returns the stream
// once default arrived (the opening of most stream tests).
func (h *harness) withDefault(t testing.TB) *sotwClient {
	t.Helper()
	c := newSotw(t, h.client, nil)
	c.request(dflt)
	c.recvSecret()
	return c
}

func newSotw(t testing.TB, c secretv3.SecretDiscoveryServiceClient, node *corev3.Node) *sotwClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	t.Cleanup(cancel)
	s, err := c.StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if node == nil {
		node = &corev3.Node{Id: "sidecar~10.0.0.1~pod.default~default.svc.cluster.local"}
	}
	return &sotwClient{t: t, s: s, node: node}
}

// send sends a raw request; the first one carries the node.
func (c *sotwClient) send(req *discoveryv3.DiscoveryRequest) {
	c.t.Helper()
	if !c.sent {
		req.Node = c.node
		c.sent = true
	}
	if err := c.s.Send(req); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// request subscribes to names, acknowledging the latest response.
func (c *sotwClient) request(names ...string) {
	c.t.Helper()
	c.names = names
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: names, VersionInfo: c.version, ResponseNonce: c.nonce})
}

// ack acknowledges the latest response.
func (c *sotwClient) ack() { c.t.Helper(); c.request(c.names...) }

// nack rejects the latest response.
func (c *sotwClient) nack() {
	c.t.Helper()
	c.send(&discoveryv3.DiscoveryRequest{
		TypeUrl: sdsserver.SecretTypeURL, ResourceNames: c.names, VersionInfo: c.version, ResponseNonce: c.nonce,
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: "test: bad certificate"},
	})
}

// recv returns the next response, recording its nonce and version.
func (c *sotwClient) recv() *discoveryv3.DiscoveryResponse {
	c.t.Helper()
	r, err := c.s.Recv()
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	if r.GetNonce() == "" || r.GetVersionInfo() == "" || r.GetTypeUrl() != sdsserver.SecretTypeURL {
		c.t.Fatalf("response lacks nonce, version or type: %v", r)
	}
	c.nonce, c.version = r.GetNonce(), r.GetVersionInfo()
	return r
}

// recvSecret returns the single secret of the next response.
func (c *sotwClient) recvSecret() *tlsv3.Secret {
	c.t.Helper()
	r := c.recv()
	if len(r.GetResources()) != 1 {
		c.t.Fatalf("response has %d resources, want 1", len(r.GetResources()))
	}
	return unpack(c.t, r.GetResources()[0])
}

// wantSecret receives the next response, of one secret, and fails the
// test unless the secret is named want; when says after what.
func (c *sotwClient) wantSecret(want, when string) *tlsv3.Secret {
	c.t.Helper()
	s := c.recvSecret()
	if s.GetName() != want {
		c.t.Fatalf("%s: got %q, want %q", when, s.GetName(), want)
	}
	return s
}

// recvNamed receives responses until all names arrived (in any order).
func (c *sotwClient) recvNamed(names ...string) map[string]*tlsv3.Secret {
	c.t.Helper()
	got := map[string]*tlsv3.Secret{}
	for len(got) < len(names) {
		s := c.recvSecret()
		if !contains(names, s.GetName()) || got[s.GetName()] != nil {
			c.t.Fatalf("received %q, want one of %v once each", s.GetName(), names)
		}
		got[s.GetName()] = s
	}
	return got
}

func contains(names []string, n string) bool {
	for _, m := range names {
		if m == n {
			return true
		}
	}
	return false
}

func unpack(t testing.TB, a *anypb.Any) *tlsv3.Secret {
	t.Helper()
	if a.GetTypeUrl() != sdsserver.SecretTypeURL {
		t.Fatalf("resource type %q", a.GetTypeUrl())
	}
	s := &tlsv3.Secret{}
	if err := a.UnmarshalTo(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// tlsCert parses a TlsCertificate secret.
func tlsCert(t testing.TB, s *tlsv3.Secret) ([]*x509.Certificate, crypto.Signer) {
	t.Helper()
	tc := s.GetTlsCertificate()
	if tc == nil {
		t.Fatalf("secret %q is not a TlsCertificate: %v", s.GetName(), s)
	}
	chain, err := certs.ParseCertificates(tc.GetCertificateChain().GetInlineBytes())
	if err != nil {
		t.Fatalf("certificate chain: %v", err)
	}
	key, err := certs.ParsePrivateKey(tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		t.Fatalf("private key: %v", err)
	}
	return chain, key
}

// trustedCA parses a CertificateValidationContext secret's trusted_ca.
func trustedCA(t testing.TB, s *tlsv3.Secret) []*x509.Certificate {
	t.Helper()
	vc := s.GetValidationContext()
	if vc == nil || vc.GetTrustedCa() == nil {
		t.Fatalf("secret %q has no trusted_ca: %v", s.GetName(), s)
	}
	roots, err := certs.ParseCertificates(vc.GetTrustedCa().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	return roots
}

// verifySVID checks that chain and key form an X509-SVID for testID under
// roots, with go-spiffe.
func verifySVID(t testing.TB, chain []*x509.Certificate, key crypto.Signer, roots []*x509.Certificate) {
	t.Helper()
	id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(testTD, roots))
	if err != nil {
		t.Fatalf("chain does not verify: %v", err)
	}
	if id != testID {
		t.Fatalf("SPIFFE ID %s, want %s", id, testID)
	}
	if !certs.KeyMatches(chain[0].PublicKey, key) {
		t.Fatal("private key does not match the leaf")
	}
}

func serial(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// spiffeNode is a node asking for the SPIFFE validator form of roots.
func spiffeNode(v *structpb.Value) *corev3.Node {
	return &corev3.Node{Id: "spiffe-node", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		sdsserver.SPIFFEValidatorMetadataKey: v,
	}}}
}

func idOf(t testing.TB, c *x509.Certificate) spiffeid.ID {
	t.Helper()
	id, err := x509svid.IDFromCert(c)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
