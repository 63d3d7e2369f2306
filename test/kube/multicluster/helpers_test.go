package multicluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/testkit"
)

var trustDomain = spiffeid.RequireTrustDomainFromString("cluster.local")

// caNamespace is the CA's namespace in cluster A, where remote secrets go.
const caNamespace = "istio-system"

// workload is a service account with a pod in one cluster.
type workload struct {
	c      *harness.Cluster
	ns, sa string
	pod    *corev1.Pod
}

func newWorkload(t *testing.T, c *harness.Cluster, ns, sa string) workload {
	t.Helper()
	ctx := context.Background()
	if err := c.CreateServiceAccount(ctx, ns, sa); err != nil {
		t.Fatal(err)
	}
	pod, err := c.CreatePod(ctx, ns, sa+"-0", sa)
	if err != nil {
		t.Fatal(err)
	}
	return workload{c: c, ns: ns, sa: sa, pod: pod}
}

// token is a fresh istio-ca token of the workload, bound to its pod: one
// no CA has reviewed yet.
func (w workload) token(t *testing.T) string {
	t.Helper()
	tok, err := w.c.Token(context.Background(), harness.TokenSpec{Namespace: w.ns, ServiceAccount: w.sa, Audiences: []string{"istio-ca"}, Pod: w.pod})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (w workload) id() spiffeid.ID {
	return spiffeid.RequireFromSegments(trustDomain, "ns", w.ns, "sa", w.sa)
}

// readerKubeconfig gives cluster c a service account for the CA, allowed
// only what a remote cluster must grant (tokenreviews create), and writes
// a kubeconfig with its token: what istioctl create-remote-secret does.
func readerKubeconfig(t *testing.T, c *harness.Cluster) []byte {
	t.Helper()
	return kubeconfigFor(t, c, "meshid-reader", rbacv1.PolicyRule{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}})
}

// kubeconfigFor is readerKubeconfig for service account name allowed
// rules.
func kubeconfigFor(t *testing.T, c *harness.Cluster, name string, rules ...rbacv1.PolicyRule) []byte {
	t.Helper()
	ctx := context.Background()
	if err := c.CreateServiceAccount(ctx, caNamespace, name); err != nil {
		t.Fatal(err)
	}
	rbac := c.Client().RbacV1()
	_, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      rules,
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: caNamespace, Name: name}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tok, err := c.Token(ctx, harness.TokenSpec{Namespace: caNamespace, ServiceAccount: name, Expiration: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	path, err := c.TokenKubeconfig(name, tok)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ca is a running CA in cluster A and a gRPC client of it.
type ca struct {
	srv    *caserver.Server
	reg    *prometheus.Registry
	client securityapi.IstioCertificateServiceClient
	jwt    *jwtapi.Client
	roots  []*x509.Certificate
}

// startCA runs the CA assembly (what `meshid server` runs) in cluster A,
// with mod applied to its Config.
func startCA(t *testing.T, mod func(*caserver.Config)) *ca {
	t.Helper()
	if err := clusterA.EnsureNamespace(context.Background(), caNamespace); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := caserver.Config{
		TrustDomain: trustDomain,
		Kube: caserver.KubeConfig{
			Kubeconfig:           clusterA.AdminKubeconfig(),
			Namespace:            caNamespace,
			PodName:              "meshid-0",
			DisableRootConfigMap: true,
		},
		Clusters: caserver.ClustersConfig{
			ID: idA,
		},
		Monitoring: caserver.MonitoringConfig{
			Listen: "127.0.0.1:0",
		},
		Registerer: reg,
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name()),
	}
	if mod != nil {
		mod(&cfg)
	}
	s := testkit.CA(t, cfg)
	roots := s.Authority().Bundle().Roots
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	conn, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &ca{srv: s, reg: reg, client: securityapi.NewIstioCertificateServiceClient(conn), jwt: jwtapi.NewClient(conn), roots: roots}
}

// sign asks for a certificate of id with token, sending ClusterID=cluster
// unless cluster is empty, and verifies the answer is an SVID of id.
func (c *ca) sign(ctx context.Context, token, cluster string, id spiffeid.ID) error {
	var md map[string]any
	if cluster != "" {
		md = map[string]any{"ClusterID": cluster}
	}
	return c.request(ctx, token, md, id)
}

// request asks for a certificate of id with token and metadata md, and
// verifies the answer is an SVID of id.
func (c *ca) request(ctx context.Context, token string, md map[string]any, id spiffeid.ID) error {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		return err
	}
	der, err := certs.NewCSR(key, id)
	if err != nil {
		return err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := &securityapi.IstioCertificateRequest{Csr: string(certs.EncodeCSR(der)), ValidityDuration: 3600}
	if md != nil {
		if req.Metadata, err = structpb.NewStruct(md); err != nil {
			return err
		}
	}
	resp, err := c.client.CreateCertificate(ctx, req)
	if err != nil {
		return err
	}
	var chain []*x509.Certificate
	for _, p := range resp.GetCertChain() {
		cs, err := certs.ParseCertificates([]byte(p))
		if err != nil {
			return err
		}
		chain = append(chain, cs...)
	}
	got, _, err := x509svid.Verify(chain[:len(chain)-len(c.roots)], x509bundle.FromX509Authorities(trustDomain, c.roots))
	if err != nil {
		return fmt.Errorf("verify the answer: %w", err)
	}
	if got != id {
		return fmt.Errorf("signed %s, want %s", got, id)
	}
	return nil
}

// metric is the value of one sample of the CA's registry.
func (c *ca) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return testkit.Metric(t, c.reg, name, labels...)
}

// state is 1 when cluster's gauge shows state, 0 while that series is absent
// (the cluster is still being probed): for polling.
func (c *ca) state(t *testing.T, cluster, state string) float64 {
	t.Helper()
	v, _ := testkit.LookupMetric(t, c.reg, "meshid_ca_remote_cluster_state", "cluster", cluster, "state", state)
	return v
}
