package harness

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// SuiteTimeout bounds a suite's cluster start-up and setup (Main).
const SuiteTimeout = 30 * time.Minute

// Main is a suite's TestMain body: it boots a cluster with cfg (its
// warnings logged to stderr when cfg.Logger is nil), hands it to setup,
// runs the tests and stops the cluster. A failed boot or setup is printed
// and fails the suite, never skips it. Use: os.Exit(harness.Main(m, cfg, setup)).
func Main(m *testing.M, cfg Config, setup func(context.Context, *Cluster) error) int {
	ctx, cancel := context.WithTimeout(context.Background(), SuiteTimeout)
	defer cancel()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	c, err := Boot(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Stop()
	if setup != nil {
		if err := setup(ctx, c); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// ApplyDeploy applies the manifests of the repository's deploy/ files
// (paths relative to deploy/) for real, server-side, in order, and
// returns what the API server stored, one slice per file.
func (c *Cluster) ApplyDeploy(ctx context.Context, files ...string) ([][]*unstructured.Unstructured, error) {
	repo, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	var stored [][]*unstructured.Unstructured
	for _, f := range files {
		objs, err := ReadManifests(filepath.Join(repo, "deploy", f))
		if err != nil {
			return nil, err
		}
		got, err := c.Apply(ctx, objs...)
		if err != nil {
			return nil, fmt.Errorf("deploy/%s: %w", f, err)
		}
		stored = append(stored, got)
	}
	return stored, nil
}

// ServiceAccountKubeconfig writes a kubeconfig named name that
// authenticates as namespace/account with a bound token valid for two
// hours (longer than any suite), and returns its path.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, account, name string) (string, error) {
	tok, err := c.Token(ctx, TokenSpec{Namespace: namespace, ServiceAccount: account, Expiration: 2 * time.Hour})
	if err != nil {
		return "", err
	}
	return c.TokenKubeconfig(name, tok)
}
