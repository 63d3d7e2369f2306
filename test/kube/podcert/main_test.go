package podcert_test

import (
	"context"
	"os"
	"testing"

	"github.com/meshid/meshid/test/kube/harness"
)

const (
	caNamespace = "istio-system"
	caAccount   = "meshid"
	signerName  = "meshid.io/workload"
	bundleName  = "meshid.io:workload:roots"
)

var (
	// cluster is the real etcd + kube-apiserver (Node,RBAC and
	// NodeRestriction) every test shares; tests use namespaces of their own.
	cluster *harness.Cluster
	// caKubeconfig authenticates as the CA's ServiceAccount.
	caKubeconfig string
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Config{NodeAuthorization: true}, setup))
}

// setup applies the CA's namespace and RBAC from deploy/ for real
// (server-side apply), the pod certificate rules included, and makes a
// kubeconfig of its ServiceAccount.
func setup(ctx context.Context, c *harness.Cluster) (err error) {
	cluster = c
	if _, err := c.ApplyDeploy(ctx, "namespace/istio-system.yaml", "10-rbac.yaml", "pod-certificates/rbac.yaml"); err != nil {
		return err
	}
	caKubeconfig, err = c.ServiceAccountKubeconfig(ctx, caNamespace, caAccount, "meshid-ca")
	return err
}
