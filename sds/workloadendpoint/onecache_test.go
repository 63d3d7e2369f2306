package workloadendpoint_test

import (
	"crypto/x509"
	"path/filepath"
	"testing"

	corev1 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// One cache: an SDS server and the Workload API on one Manager serve the
// same certificate, and one rotation (the fake clock's) reaches an SDS
// stream and a Workload API stream with the same new certificate.
func TestOneRotationReachesSDSAndWorkloadAPI(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	ctx := guardCtx(t)
	sdsPath := filepath.Join(testkit.ShortDir(t), "sds.sock")
	sdsSrv, err := sdsserver.New(sdsserver.Config{Source: a.m, SocketPath: sdsPath, Clock: a.clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := sdsSrv.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "sds", sdsSrv.Run)

	stream, err := secretv3.NewSecretDiscoveryServiceClient(testkit.DialUnix(t, sdsPath)).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: []string{secretcache.DefaultName}, Node: &corev1.Node{Id: "test"}}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	sdsLeaf := func() *x509.Certificate {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var sec tlsv3.Secret
		if err := resp.Resources[0].UnmarshalTo(&sec); err != nil {
			t.Fatal(err)
		}
		chain, err := certs.ParseCertificates(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
		if err != nil {
			t.Fatal(err)
		}
		// ACK, so that the next version is pushed.
		if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: req.ResourceNames, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
		return chain[0]
	}

	src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(a.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	wl, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	if first := sdsLeaf(); !first.Equal(wl.Certificates[0]) {
		t.Fatal("SDS and the Workload API serve different certificates")
	}

	updated := src.Updated()
	a.rotate(t)
	second := sdsLeaf()
	select {
	case <-updated:
	case <-ctx.Done():
		t.Fatal("Workload API source not updated")
	}
	wl2, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	if second.Equal(wl.Certificates[0]) {
		t.Fatal("SDS did not push the rotated certificate")
	}
	if !second.Equal(wl2.Certificates[0]) {
		t.Fatalf("after one rotation SDS serves serial %s, the Workload API serial %s", second.SerialNumber, wl2.Certificates[0].SerialNumber)
	}
}
