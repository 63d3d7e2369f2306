package upstreamha_test

import (
	"context"
	"os"
	"testing"

	"github.com/meshid/meshid/test/kube/harness"
)

const caNamespace = "istio-system"

var (
	// cluster is the real etcd + kube-apiserver the tests share.
	cluster *harness.Cluster
	// caKubeconfig authenticates as the CA's ServiceAccount (deploy/).
	caKubeconfig string
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Config{}, setup))
}

// setup applies the CA's namespace and RBAC from deploy/ for real
// (server-side apply) and makes a kubeconfig of its ServiceAccount: the
// replicas have exactly the rights deploy/ grants.
func setup(ctx context.Context, c *harness.Cluster) (err error) {
	cluster = c
	if _, err := c.ApplyDeploy(ctx, "namespace/istio-system.yaml", "10-rbac.yaml"); err != nil {
		return err
	}
	caKubeconfig, err = c.ServiceAccountKubeconfig(ctx, caNamespace, "meshid", "meshid-ca")
	return err
}
