package caclient_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/testkit"
)

// hierarchy is a root, an intermediate under it, and a serving certificate,
// all created at run time.
type hierarchy struct {
	root, inter *x509.Certificate
	interKey    crypto.Signer
}

func newHierarchy(t *testing.T) *hierarchy {
	t.Helper()
	now := time.Now()
	root, rootKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "test root"}, NotBefore: now.Add(-time.Hour), TTL: 24 * time.Hour, MaxPathLen: -1})
	interKey, _ := certs.GenerateKey(certs.ECP256)
	inter, err := certs.NewIntermediateCA(certs.CASpec{Subject: pkix.Name{CommonName: "test intermediate"}, Key: interKey, NotBefore: now.Add(-time.Hour), TTL: 24 * time.Hour, MaxPathLen: 0}, root, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	return &hierarchy{root: root, inter: inter, interKey: interKey}
}

// issue signs a leaf for pub with the given URIs, DNS names and IPs.
func (h *hierarchy) issue(t *testing.T, pub crypto.PublicKey, uris []*url.URL, dns []string, ips []net.IP, notAfter time.Time) *x509.Certificate {
	t.Helper()
	serial, _ := certs.NewSerial()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     notAfter,
		URIs:         uris,
		DNSNames:     dns,
		IPAddresses:  ips,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	return testkit.Certificate(t, tmpl, h.inter, pub, h.interKey)
}

func pemOf(cs ...*x509.Certificate) string { return string(certs.EncodeCertificates(cs...)) }

// request is what the test CA saw.
type request struct {
	auth     []string
	req      *pb.IstioCertificateRequest
	csr      *x509.CertificateRequest
	clientUA string
}

// testCA is an IstioCertificateService on a real TLS gRPC server. By default
// it answers like meshid's CA: leaf, intermediate, root bundle.
type testCA struct {
	pb.UnimplementedIstioCertificateServiceServer
	t    *testing.T
	h    *hierarchy
	addr string
	tls  *tls.Config

	mu      sync.Mutex
	srv     *grpc.Server
	reqs    []request
	respond func(csr *x509.CertificateRequest, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error)
}

// clientConfig is the Config of a client of ca: its address, its root and
// a token file holding "t".
func (ca *testCA) clientConfig(t *testing.T) caclient.Config {
	t.Helper()
	tok := tokenPath(t)
	writeToken(t, tok, "t")
	return caclient.Config{Addr: ca.addr, Roots: []*x509.Certificate{ca.h.root}, TokenFile: tok}
}

// startCA serves on 127.0.0.1:0 with a serving certificate for dnsNames and
// ips.
func startCA(t *testing.T, dnsNames []string, ips []net.IP) *testCA {
	t.Helper()
	ca := &testCA{t: t, h: newHierarchy(t)}
	key, _ := certs.GenerateKey(certs.ECP256)
	serving := ca.h.issue(t, key.Public(), nil, dnsNames, ips, time.Now().Add(time.Hour))
	ca.tls = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{serving.Raw, ca.h.inter.Raw}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
	}
	ca.addr = "127.0.0.1:0"
	ca.start()
	t.Cleanup(ca.stop)
	return ca
}

// start serves on ca.addr (the same address again after a stop).
func (ca *testCA) start() {
	ca.t.Helper()
	lis, err := net.Listen("tcp", ca.addr)
	if err != nil {
		ca.t.Fatal(err)
	}
	ca.addr = lis.Addr().String()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(ca.tls)))
	pb.RegisterIstioCertificateServiceServer(srv, ca)
	go func() { _ = srv.Serve(lis) }()
	ca.mu.Lock()
	ca.srv = srv
	ca.mu.Unlock()
}

// stop stops the server and closes its connections, like a CA crash.
func (ca *testCA) stop() {
	ca.mu.Lock()
	srv := ca.srv
	ca.mu.Unlock()
	srv.Stop()
}

func (ca *testCA) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	b, _ := pem.Decode([]byte(req.GetCsr()))
	if b == nil {
		return nil, status.Error(codes.InvalidArgument, "no PEM")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ca.mu.Lock()
	ca.reqs = append(ca.reqs, request{auth: md.Get("authorization"), req: req, csr: csr, clientUA: strings.Join(md.Get("user-agent"), ",")})
	respond := ca.respond
	ca.mu.Unlock()
	if respond != nil {
		return respond(csr, req)
	}
	return ca.standard(csr, req)
}

func (ca *testCA) standard(csr *x509.CertificateRequest, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	ttl := time.Duration(req.GetValidityDuration()) * time.Second
	if ttl == 0 {
		ttl = time.Hour
	}
	leaf := ca.h.issue(ca.t, csr.PublicKey, csr.URIs, nil, nil, time.Now().Add(ttl))
	return &pb.IstioCertificateResponse{CertChain: []string{pemOf(leaf), pemOf(ca.h.inter), pemOf(ca.h.root)}}, nil
}

func (ca *testCA) setRespond(f func(*x509.CertificateRequest, *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error)) {
	ca.mu.Lock()
	ca.respond = f
	ca.mu.Unlock()
}

func (ca *testCA) requests() []request {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return append([]request(nil), ca.reqs...)
}

func writeToken(t testing.TB, path, tok string) {
	t.Helper()
	if err := certs.WriteFileAtomic(path, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
}

func tokenPath(t *testing.T) string { return filepath.Join(t.TempDir(), "istio-token") }

// newCSR returns a key and a CSR for uri.
func newCSR(t testing.TB, uri string) (crypto.Signer, *x509.CertificateRequest) {
	t.Helper()
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(uri)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, csr
}

func mustRemove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}
