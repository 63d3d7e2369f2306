package sdsfetch_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/sdsfetch"
	"github.com/meshid/meshid/testkit"
)

// streamServer answers StreamSecrets with the secrets it knows and records
// ACKs; it never answers names it does not know, like a real SotW server.
type streamServer struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
	secrets map[string]*tlsv3.Secret
	mu      sync.Mutex
	acks    []*discoveryv3.DiscoveryRequest
}

func (s *streamServer) StreamSecrets(st secretv3.SecretDiscoveryService_StreamSecretsServer) error {
	nonce := 0
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if req.GetResponseNonce() != "" {
			s.mu.Lock()
			s.acks = append(s.acks, req)
			s.mu.Unlock()
			continue
		}
		resp, ok := respond(s.secrets, req.GetResourceNames())
		if !ok {
			continue
		}
		nonce++
		resp.Nonce = strconv.Itoa(nonce)
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// fetchServer implements only the unary FetchSecrets.
type fetchServer struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
	secrets map[string]*tlsv3.Secret
}

func (s *fetchServer) FetchSecrets(_ context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	resp, _ := respond(s.secrets, req.GetResourceNames())
	return resp, nil
}

func respond(secrets map[string]*tlsv3.Secret, names []string) (*discoveryv3.DiscoveryResponse, bool) {
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: "v1", TypeUrl: sdsfetch.TypeURL}
	for _, n := range names {
		if sec, ok := secrets[n]; ok {
			a, err := anypb.New(sec)
			if err != nil {
				panic(err)
			}
			resp.Resources = append(resp.Resources, a)
		}
	}
	return resp, len(resp.Resources) != 0
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

type fixture struct {
	root, leaf *x509.Certificate
	secrets    map[string]*tlsv3.Secret
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	now := time.Now()
	rootKey, _ := certs.GenerateKey(certs.ECP256)
	root, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: "root"}, Key: rootKey, NotBefore: now, TTL: time.Hour, MaxPathLen: -1})
	if err != nil {
		t.Fatal(err)
	}
	leafKey, _ := certs.GenerateKey(certs.ECP256)
	leaf, err := certs.NewIntermediateCA(certs.CASpec{Subject: pkix.Name{CommonName: "leafish"}, Key: leafKey, NotBefore: now, TTL: time.Hour}, root, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := certs.EncodePrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	spiffeCfg, err := anypb.New(&tlsv3.SPIFFECertValidatorConfig{TrustDomains: []*tlsv3.SPIFFECertValidatorConfig_TrustDomain{
		{Name: "cluster.local", TrustBundle: inline(certs.EncodeCertificates(root))},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return fixture{root: root, leaf: leaf, secrets: map[string]*tlsv3.Secret{
		"default": {Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(certs.EncodeCertificates(leaf)),
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(keyPEM)}},
		}}},
		"ROOTCA": {Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: inline(certs.EncodeCertificates(root)),
		}}},
		"spiffe": {Name: "spiffe", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: "envoy.tls.cert_validator.spiffe", TypedConfig: spiffeCfg},
		}}},
		"broken": {Name: "broken", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline([]byte("-----BEGIN CERTIFICATE-----\nMIIB")),
		}}},
	}}
}

func TestFetch(t *testing.T) {
	f := newFixture(t)
	stream := &streamServer{secrets: f.secrets}
	streamSock := testkit.ServeUnix(t, func(s *grpc.Server) { secretv3.RegisterSecretDiscoveryServiceServer(s, stream) })
	fetchSock := testkit.ServeUnix(t, func(s *grpc.Server) {
		secretv3.RegisterSecretDiscoveryServiceServer(s, &fetchServer{secrets: f.secrets})
	})
	for _, tc := range []struct{ name, sock string }{{"StreamSecrets", streamSock}, {"FetchSecrets fallback", fetchSock}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sdsfetch.Fetch(context.Background(), sdsfetch.Config{Socket: tc.sock, Names: []string{"default", "ROOTCA", "spiffe"}})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 3 || got[0].Name != "default" || got[1].Name != "ROOTCA" || got[2].Name != "spiffe" {
				t.Fatalf("got %+v", got)
			}
			d := got[0]
			if d.Kind != sdsfetch.KindTLSCertificate || len(d.Chain) != 1 || !d.Chain[0].Equal(f.leaf) || d.Key == nil || !certs.KeyMatches(f.leaf.PublicKey, d.Key) || d.Version != "v1" {
				t.Fatalf("default = %+v", d)
			}
			for _, r := range got[1:] {
				if r.Kind != sdsfetch.KindValidationContext || len(r.Roots) != 1 || !r.Roots[0].Equal(f.root) {
					t.Fatalf("%s = %+v", r.Name, r)
				}
			}
		})
	}
	stream.mu.Lock()
	defer stream.mu.Unlock()
	if len(stream.acks) != 3 {
		t.Fatalf("server saw %d ACKs, want 3 (one per stream)", len(stream.acks))
	}
	for _, a := range stream.acks {
		if a.GetVersionInfo() != "v1" || a.GetErrorDetail() != nil {
			t.Fatalf("ACK = %v, want version v1 without error", a)
		}
	}
}

func TestFetchDefaultNames(t *testing.T) {
	f := newFixture(t)
	sock := testkit.ServeUnix(t, func(s *grpc.Server) {
		secretv3.RegisterSecretDiscoveryServiceServer(s, &streamServer{secrets: f.secrets})
	})
	got, err := sdsfetch.Fetch(context.Background(), sdsfetch.Config{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "default" || got[1].Name != "ROOTCA" {
		t.Fatalf("got %+v, want default and ROOTCA", got)
	}
}

func TestFetchErrors(t *testing.T) {
	f := newFixture(t)
	sds := testkit.ServeUnix(t, func(s *grpc.Server) {
		secretv3.RegisterSecretDiscoveryServiceServer(s, &streamServer{secrets: f.secrets})
	})
	notSDS := testkit.ServeUnix(t, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health.NewServer()) })

	garbage := filepath.Join(testkit.ShortDir(t), "s.sock")
	lis, err := net.Listen("unix", garbage)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	regular := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(regular, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		sock  string
		names []string
		want  string
	}{
		{"missing socket", filepath.Join(t.TempDir(), "nope"), nil, "no such socket"},
		{"regular file", regular, nil, "not a Unix socket"},
		{"gRPC but not SDS", notSDS, nil, "not an SDS server (unknown service envoy.service.secret.v3.SecretDiscoveryService)"},
		{"not gRPC", garbage, nil, "not an SDS server, or not answering"},
		{"unknown resource", sds, []string{"default", "nope"}, `no answer for resource "nope" within 300ms`},
		{"malformed chain", sds, []string{"broken"}, `resource "broken": certificate_chain: truncated or corrupt PEM`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sdsfetch.Fetch(context.Background(), sdsfetch.Config{Socket: tc.sock, Names: tc.names, Timeout: 300 * time.Millisecond})
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "sdsfetch: "+tc.sock+": ") || !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q, want one line naming the socket and containing %q", msg, tc.want)
			}
		})
	}
}
