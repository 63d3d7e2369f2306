package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/test/kube/node"
)

var (
	// nd and cluster are the package's one node and control plane.
	nd      *node.Node
	cluster *harness.Cluster
	// bootErr says why they did not start: every test fails with it (the
	// suite never skips; it needs root, as in CI).
	bootErr error
	// images holds the static test programs' images, built once.
	imageDir string
)

// probeRef is the image of ./node/probe.
const probeRef = "meshid.test/probe:1"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	code := m.Run()
	if stopNode != nil {
		if err := stopNode(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the node:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	if imageDir != "" {
		os.RemoveAll(imageDir)
	}
	return code
}

var (
	bootOnce sync.Once
	stopNode func() error
)

// boot builds the images and starts the node, the first time a test
// needs it (a unit test of package node alone starts nothing).
func boot() error {
	if err := node.CheckCanRun(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "meshid-node-images-")
	if err != nil {
		return err
	}
	imageDir = dir
	probe, err := staticImage(probeRef, "./node/probe", "/probe")
	if err != nil {
		return err
	}
	workload, err := staticImage(workloadRef, "./node/workload", "/workload")
	if err != nil {
		return err
	}
	ca, agent, err := node.MeshidImages(imageDir, "", "latest")
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, c, stop, err := node.Boot(ctx, node.Config{Images: []node.Image{probe, workload, ca, agent}, Logger: logger},
		harness.Config{Logger: logger})
	if err != nil {
		return err
	}
	nd, cluster, stopNode = n, c, stop
	return nil
}

// need fails t when the node did not start, with the reason.
func need(t testing.TB) {
	t.Helper()
	bootOnce.Do(func() { bootErr = boot() })
	if bootErr != nil {
		t.Fatalf("the node suite cannot run: %v", bootErr)
	}
}

// staticImage builds the static program pkg of this module and returns an
// image of it at path, run as the nonroot user.
func staticImage(ref, pkg, path string) (node.Image, error) {
	root, err := harness.ModuleRoot()
	if err != nil {
		return node.Image{}, err
	}
	bin, err := node.BuildStatic(root, pkg, imageDir)
	if err != nil {
		return node.Image{}, err
	}
	return node.Image{
		Ref:        ref,
		Files:      map[string]node.File{path: {Source: bin, Mode: 0o755}, "/tmp": {Dir: true, Mode: 0o1777}},
		Entrypoint: []string{path},
		User:       "65532:65532",
	}, nil
}
