package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/testkit"
)

const secretType = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// TestAgentEndToEnd runs `meshid agent` with a real TokenRequest token, the
// way a projected volume delivers it (audience istio-ca, bound to the pod),
// against `meshid server` reviewing it with the real API server, and takes
// the workload certificate and the roots over SDS as Envoy would.
func TestAgentEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorkload(t, "agent-e2e")
	srv := startCA(t, cluster.AdminKubeconfig())
	roots := srv.stateRoots(t)

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "istio-token")
	tok, err := cluster.Token(ctx, harness.TokenSpec{
		Namespace: w.ns, ServiceAccount: w.sa, Audiences: []string{"istio-ca"}, Pod: w.pod, Expiration: 12 * time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "workload-spiffe-uds", "socket")
	monitor, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	runMeshid(t, "meshid-agent", dir, monitor, "agent",
		"--ca-addr", srv.addr,
		"--ca-root", filepath.Join(srv.stateDir, "root-cert.pem"),
		"--token-file", tokenFile,
		"--sds-socket", socket,
		"--monitoring-listen", monitor,
		"--trust-domain", trustDomain.Name(),
	)

	sds := secretv3.NewSecretDiscoveryServiceClient(testkit.DialUnix(t, socket))
	node := &corev3.Node{Id: "sidecar~10.0.0.1~workload-0.agent-e2e~agent-e2e.svc.cluster.local", Cluster: "workload"}

	// default over a state-of-the-world stream, as Envoy asks for it.
	stream, err := sds.StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: secretType, ResourceNames: []string{"default"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	def := decodeSecret(t, resp, "default")
	tc := def.GetTlsCertificate()
	chain, err := certs.ParseCertificates(tc.GetCertificateChain().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.ParsePrivateKey(tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	if !certs.KeyMatches(chain[0].PublicKey, key) {
		t.Fatal("the served private key does not match the served leaf")
	}
	verifySVID(t, chain, roots, workloadID(w.ns, w.sa))
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}

	// ROOTCA with a unary fetch.
	fresp, err := sds.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: secretType, ResourceNames: []string{"ROOTCA"}})
	if err != nil {
		t.Fatal(err)
	}
	vc := decodeSecret(t, fresp, "ROOTCA").GetValidationContext()
	got, err := certs.ParseCertificates(vc.GetTrustedCa().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(roots) || !got[0].Equal(roots[0]) {
		t.Fatalf("ROOTCA holds %d certificates, not the CA's root", len(got))
	}
}

func decodeSecret(t *testing.T, resp *discoveryv3.DiscoveryResponse, name string) *tlsv3.Secret {
	t.Helper()
	if len(resp.GetResources()) != 1 {
		t.Fatalf("%s: %d resources in the response, want 1", name, len(resp.GetResources()))
	}
	s := &tlsv3.Secret{}
	if err := resp.GetResources()[0].UnmarshalTo(s); err != nil {
		t.Fatal(err)
	}
	if s.GetName() != name {
		t.Fatalf("secret name %q, want %q", s.GetName(), name)
	}
	return s
}
