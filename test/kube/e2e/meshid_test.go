package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	securityapi "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/testkit"
)

// binDir is a temporary directory for the meshid binary (set by TestMain).
var binDir string

// meshid returns the meshid command, built once from the repository root
// exactly as a user builds it. Tests that do not run it (the API server
// facts, the manifests) do not depend on it building.
func meshid(t *testing.T) string {
	t.Helper()
	bin, err := harness.BuildMeshidOnce(binDir)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

var trustDomain = spiffeid.RequireTrustDomainFromString("cluster.local")

// caServer is a running `meshid server`.
type caServer struct {
	addr     string // gRPC CSR API
	monitor  string // /metrics /healthz /readyz
	stateDir string
	proc     *harness.Process
	conn     *grpc.ClientConn
	client   securityapi.IstioCertificateServiceClient
	roots    []*x509.Certificate
}

// startCA runs `meshid server --kubeconfig kubeconfig` with extra flags,
// waits until /readyz answers 200, and stops it when the test ends.
func startCA(t *testing.T, kubeconfig string, extra ...string) *caServer {
	t.Helper()
	s := launchCA(t, kubeconfig, extra...)
	waitHTTP(t, s.proc, "http://"+s.monitor+"/readyz")
	return s
}

// launchCA is startCA without the wait for /readyz, for a CA that starts
// while it cannot be ready.
func launchCA(t *testing.T, kubeconfig string, extra ...string) *caServer {
	t.Helper()
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	monitor, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &caServer{addr: addr, monitor: monitor, stateDir: filepath.Join(dir, "state")}
	args := append([]string{"server",
		"--listen", addr,
		"--monitoring-listen", monitor,
		"--state-dir", s.stateDir,
		"--trust-domain", trustDomain.Name(),
		"--kubeconfig", kubeconfig,
		"--token-audiences", "istio-ca",
	}, extra...)
	s.proc = startMeshid(t, "meshid-server", dir, args...)
	t.Cleanup(func() { // before the process stops
		if s.conn != nil {
			s.conn.Close()
		}
	})
	return s
}

// runMeshid runs the meshid binary with args as name, its log in
// dir/name.log, until the test ends (logging the log's tail when the test
// failed), and returns once /readyz on its --monitoring-listen address,
// monitor, answers 200: the server serves, the agent holds its first
// certificate.
func runMeshid(t *testing.T, name, dir, monitor string, args ...string) *harness.Process {
	t.Helper()
	p := startMeshid(t, name, dir, args...)
	waitHTTP(t, p, "http://"+monitor+"/readyz")
	return p
}

// startMeshid starts the meshid binary with args as name, its log in
// dir/name.log, until the test ends (logging the log's tail when the test
// failed).
func startMeshid(t *testing.T, name, dir string, args ...string) *harness.Process {
	t.Helper()
	p, err := harness.StartProcess(name, meshid(t), filepath.Join(dir, name+".log"), nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.Tail(8192))
		}
	})
	return p
}

// connect dials the CA's gRPC endpoint, trusting roots (the serving
// certificate is signed by the CA and carries "localhost").
func (s *caServer) connect(t *testing.T, roots []*x509.Certificate) {
	t.Helper()
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	s.conn, s.client, s.roots = conn, securityapi.NewIstioCertificateServiceClient(conn), roots
}

// stateRoots reads the root the server wrote into its --state-dir.
func (s *caServer) stateRoots(t *testing.T) []*x509.Certificate {
	t.Helper()
	return testkit.ReadCerts(t, filepath.Join(s.stateDir, "root-cert.pem"))
}

// sign sends a CSR for id with token as the bearer credential and returns
// the response chain parsed (leaf first, the root bundle last).
func (s *caServer) sign(ctx context.Context, token string, id spiffeid.ID) ([]*x509.Certificate, error) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		return nil, err
	}
	der, err := certs.NewCSR(key, id)
	if err != nil {
		return nil, err
	}
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := s.client.CreateCertificate(ctx, &securityapi.IstioCertificateRequest{
		Csr:              string(certs.EncodeCSR(der)),
		ValidityDuration: int64(time.Hour / time.Second),
	})
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for i, p := range resp.GetCertChain() {
		cs, err := certs.ParseCertificates([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("cert_chain[%d]: %w", i, err)
		}
		chain = append(chain, cs...)
	}
	if len(chain) == 0 || !certs.KeyMatches(chain[0].PublicKey, key) {
		return nil, fmt.Errorf("the leaf does not hold the CSR's key")
	}
	return chain, nil
}

// verifySVID checks that chain is an X509-SVID for exactly want that
// verifies to roots, with go-spiffe's verifier.
func verifySVID(t *testing.T, chain, roots []*x509.Certificate, want spiffeid.ID) {
	t.Helper()
	bundle := x509bundle.FromX509Authorities(trustDomain, roots)
	// The chain as sent ends with the root bundle; an SVID chain does not.
	var svid []*x509.Certificate
	for _, c := range chain {
		if !isRoot(c, roots) {
			svid = append(svid, c)
		}
	}
	got, _, err := x509svid.Verify(svid, bundle)
	if err != nil {
		t.Fatalf("x509svid.Verify: %v", err)
	}
	if got != want {
		t.Fatalf("SPIFFE ID = %s, want %s", got, want)
	}
	if len(svid[0].URIs) != 1 || len(svid[0].DNSNames) != 0 || len(svid[0].IPAddresses) != 0 {
		t.Fatalf("leaf SANs: URIs %v DNS %v IPs %v; want exactly the SPIFFE ID", svid[0].URIs, svid[0].DNSNames, svid[0].IPAddresses)
	}
}

func isRoot(c *x509.Certificate, roots []*x509.Certificate) bool {
	for _, r := range roots {
		if c.Equal(r) {
			return true
		}
	}
	return false
}

func workloadID(ns, sa string) spiffeid.ID {
	return spiffeid.RequireFromSegments(trustDomain, "ns", ns, "sa", sa)
}

// waitHTTP polls url until it answers 200, failing the test if proc exits
// first or a minute passes.
func waitHTTP(t *testing.T, proc *harness.Process, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exited := proc.Exited()
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("process exited")
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v\nlog:\n%s", url, err, proc.Tail(8192))
	}
}
