package chart_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshid/meshid/test/kube/harness"
)

var (
	// cluster is the one etcd + kube-apiserver of this package.
	cluster *harness.Cluster
	// helmBin is the pinned helm CLI; chartDir the chart under test.
	helmBin, chartDir string
	// helmHome keeps helm's cache, config and data out of the user's home.
	helmHome string
)

func TestMain(m *testing.M) {
	var err error
	if helmHome, err = os.MkdirTemp("", "meshid-helm-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := harness.Main(m, harness.Config{}, setup)
	os.RemoveAll(helmHome)
	os.Exit(code)
}

// setup finds the pinned helm (built once, cached) and the chart.
func setup(_ context.Context, c *harness.Cluster) (err error) {
	cluster = c
	if helmBin, err = harness.EnsureHelm(); err != nil {
		return err
	}
	repo, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	chartDir = filepath.Join(repo, "deploy", "charts", "meshid")
	return nil
}
