package chart_test

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

var (
	// cluster is the one etcd + kube-apiserver of this package.
	cluster *harness.Cluster
	// helmBin is the pinned helm CLI; chartDir the chart under test.
	helmBin, chartDir string
	// helmHome keeps helm's cache, config and data out of the user's home.
	helmHome string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var err error
	if helmBin, err = harness.EnsureHelm(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repo, err := harness.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	chartDir = filepath.Join(repo, "deploy", "charts", "meshid")
	if helmHome, err = os.MkdirTemp("", "meshid-helm-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(helmHome)
	c, err := harness.Boot(ctx, harness.Config{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Stop()
	cluster = c
	return m.Run()
}
