package restartstorm_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := harness.Boot(ctx, harness.Config{
		// APF on, as in every real cluster (the harness default turns it
		// off): the FlowSchema is what classifies the CA's reviews.
		ExtraArgs:             []string{"--enable-priority-and-fairness=true"},
		ServiceAccountKeyType: *saKeyType,
		Logger:                slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Stop()
	cluster = c
	if err := setup(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// setup applies the CA's namespace, RBAC and FlowSchema from deploy/ for
// real (server-side apply) and makes a kubeconfig for its service account.
func setup(ctx context.Context) error {
	repo, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	for _, f := range []string{"namespace/istio-system.yaml", "10-rbac.yaml", "30-flowcontrol.yaml"} {
		objs, err := harness.ReadManifests(filepath.Join(repo, "deploy", f))
		if err != nil {
			return err
		}
		got, err := cluster.Apply(ctx, objs...)
		if err != nil {
			return err
		}
		if f == "30-flowcontrol.yaml" {
			flowObjects = got
		}
	}
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: caNamespace, ServiceAccount: caAccount, Expiration: 2 * time.Hour})
	if err != nil {
		return err
	}
	caKubeconfig, err = cluster.TokenKubeconfig("meshid-ca", tok)
	return err
}
