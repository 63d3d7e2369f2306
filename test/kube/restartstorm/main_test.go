package restartstorm_test

import (
	"context"
	"flag"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/meshid/meshid/test/kube/harness"
)

const (
	caNamespace = "istio-system"
	caAccount   = "meshid"
)

var (
	// cluster is the real etcd + kube-apiserver every test shares.
	cluster *harness.Cluster
	// caKubeconfig authenticates as the CA's service account (deploy/).
	caKubeconfig string
	// flowObjects are deploy/30-flowcontrol.yaml as the API server stored it.
	flowObjects []*unstructured.Unstructured
)

// saKeyType is the key the cluster signs service-account tokens with:
// RSA-2048 (RS256) by default, as kubeadm, EKS, GKE and AKS do, so a cold
// token costs the CA what it costs in a real cluster; -sa-key-type ec-p256
// measures ES256 tokens.
var saKeyType = flag.String("sa-key-type", harness.KeyRSA2048, "service-account key of the test cluster: rsa-2048 | ec-p256")

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(harness.Main(m, harness.Config{
		// APF on, as in every real cluster (the harness default turns it
		// off): the FlowSchema is what classifies the CA's reviews.
		ExtraArgs:             []string{"--enable-priority-and-fairness=true"},
		ServiceAccountKeyType: *saKeyType,
	}, setup))
}

// setup applies the CA's namespace, RBAC and FlowSchema from deploy/ for
// real (server-side apply) and makes a kubeconfig for its service account.
func setup(ctx context.Context, c *harness.Cluster) (err error) {
	cluster = c
	stored, err := c.ApplyDeploy(ctx, "namespace/istio-system.yaml", "10-rbac.yaml", "30-flowcontrol.yaml")
	if err != nil {
		return err
	}
	flowObjects = stored[2]
	caKubeconfig, err = c.ServiceAccountKubeconfig(ctx, caNamespace, caAccount, "meshid-ca")
	return err
}
