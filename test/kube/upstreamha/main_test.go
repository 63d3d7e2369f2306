package upstreamha_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := harness.Boot(ctx, harness.Config{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
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

// setup applies the CA's namespace and RBAC from deploy/ for real
// (server-side apply) and makes a kubeconfig of its ServiceAccount: the
// replicas have exactly the rights deploy/ grants.
func setup(ctx context.Context) error {
	repo, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	for _, f := range []string{"namespace/istio-system.yaml", "10-rbac.yaml"} {
		objs, err := harness.ReadManifests(filepath.Join(repo, "deploy", f))
		if err != nil {
			return err
		}
		if _, err := cluster.Apply(ctx, objs...); err != nil {
			return err
		}
	}
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: caNamespace, ServiceAccount: "meshid", Expiration: 2 * time.Hour})
	if err != nil {
		return err
	}
	caKubeconfig, err = cluster.TokenKubeconfig("meshid-ca", tok)
	return err
}
