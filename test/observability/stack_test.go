package observability_test

import (
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

const caNamespace = "istio-system"

// ca is a real CA (ca/caserver, what `meshid server` runs) authenticating
// offline JWTs from a dev issuer, with its /metrics on a loopback port.
type ca struct {
	dir    string
	iss    *devissuer.Issuer
	srv    *caserver.Server
	target target
	reg    *prometheus.Registry
}

// startCA runs a CA with cfg (on a self-signed root in a temporary state
// directory). A fake Kubernetes client turns TokenReview on, for its
// metrics only: the dev issuer's tokens are judged offline
// (TokenReviewIssuers names another issuer).
func startCA(t *testing.T, pod string, cfg caserver.Config) *ca {
	t.Helper()
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg.StateDir = dir
	cfg.Authn.JWTIssuer = iss.Issuer()
	cfg.Authn.JWKSFile = filepath.Join(dir, devissuer.JWKSFile)
	cfg.Kube.Client = fake.NewClientset()
	cfg.Authn.TokenReviewIssuers = []string{"https://kubernetes.default.svc.cluster.local"}
	cfg.Kube.DisableRootConfigMap = true
	cfg.Kube.PodName = pod
	cfg.Monitoring.Listen = "127.0.0.1:0"
	cfg.Registerer, cfg.Gatherer = reg, reg
	srv := testkit.CA(t, cfg)
	return &ca{dir: dir, iss: iss, srv: srv, reg: reg, target: target{addr: srv.MonitoringAddr().String(), namespace: caNamespace, pod: pod}}
}

func (c *ca) rootFile() string { return filepath.Join(c.dir, "root-cert.pem") }

func (c *ca) roots() []*x509.Certificate { return c.srv.Authority().Bundle().Roots }

// tokenFile writes a token of ns/sa for the CA's issuer.
func (c *ca) tokenFile(t *testing.T, ns, sa string) string {
	t.Helper()
	tok, err := c.iss.Mint(ns, sa, []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// client is a CA client (sds/caclient) sending the token in tokenFile.
func (c *ca) client(t *testing.T, tokenFile string) *caclient.Client {
	t.Helper()
	cl, err := caclient.New(caclient.Config{Addr: c.srv.Addr().String(), Roots: c.roots(), TokenFile: tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// csr is a fresh CSR for ns/sa.
func csr(t *testing.T, ns, sa string) *x509.CertificateRequest {
	t.Helper()
	return testkit.CSR(t, testkit.Key(t, certs.ECP256), spiffeid.RequireFromString("spiffe://cluster.local/ns/"+ns+"/sa/"+sa))
}

// runAgent runs a real agent (sds/agent) for ns/sa against caAddr, its
// /metrics on a loopback port. clk nil is the real clock.
func runAgent(t *testing.T, pod, caAddr, rootFile, tokenFile string, ttl time.Duration, clk clock.Clock) (*agent.Agent, target, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	a := testkit.RunAgent(t, agent.Config{
		CAAddr: caAddr, CARootFile: rootFile, TokenFile: tokenFile, CertTTL: ttl,
		MonitoringListen: "127.0.0.1:0", Registerer: reg, Gatherer: reg, Clock: clk,
	})
	return a, target{addr: a.MonitoringAddr().String(), namespace: "shop", pod: pod}, reg
}

// fetch asks the agent for its workload certificate, as Envoy's first SDS
// request does.
func fetch(t *testing.T, a *agent.Agent) (*secretcache.Secret, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return a.Manager().Secret(ctx, secretcache.DefaultName)
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// waitFor polls cond (a metric read from a registry) until it holds: the
// components update their counters on their own goroutines, with nothing
// to wait on. The deadline only bounds a broken run.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(15 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// counter is the value of name{labels} in g, 0 while the series does not
// exist yet (a CounterVec child is created on its first increment).
func counter(t *testing.T, g prometheus.Gatherer, name string, lbls ...string) float64 {
	t.Helper()
	v, _ := testkit.LookupMetric(t, g, name, lbls...)
	return v
}
