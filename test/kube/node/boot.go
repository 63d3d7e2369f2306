package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshid/meshid/test/kube/harness"
)

// PauseImage is the sandbox image: the static program of ./node/pause,
// built into dir.
func PauseImage(dir string) (Image, error) {
	root, err := harness.ModuleRoot()
	if err != nil {
		return Image{}, err
	}
	bin, err := BuildStatic(root, "./node/pause", dir)
	if err != nil {
		return Image{}, err
	}
	return Image{
		Ref:        DefaultPauseRef,
		Files:      map[string]File{"/pause": {Source: bin, Mode: 0o755}},
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
	}, nil
}

// Boot is what a node suite's TestMain does: check that a node can run
// here, take the machine-wide lock, find or build the binaries, clean what
// an earlier run left, start the cluster (clusterCfg with ClusterConfig's
// additions) and the node with the pause image and cfg.Images. The stop
// function stops both and releases the lock; when Boot fails, everything
// it started is stopped already.
func Boot(ctx context.Context, cfg Config, clusterCfg harness.Config) (n *Node, cluster *harness.Cluster, stop func() error, err error) {
	if err := CheckCanRun(); err != nil {
		return nil, nil, nil, err
	}
	lock, err := AcquireLock()
	if err != nil {
		return nil, nil, nil, err
	}
	stops := []func() error{lock.Release}
	stop = func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, stop())
			stop = nil
		}
	}()
	bin, err := harness.EnsureBinaries()
	if err != nil {
		return nil, nil, nil, err
	}
	cfg.BinDir, clusterCfg.BinDir = bin, bin
	stale := cleaner{
		marks:     []string{filepath.Join(os.TempDir(), "meshid-node-"), cfg.Dir},
		bridge:    orDefault(cfg.Bridge, DefaultBridge),
		kubeProxy: filepath.Join(bin, "kube-proxy"),
	}
	if err := stale.run(); err != nil {
		return nil, nil, nil, fmt.Errorf("node: cleaning what an earlier run left: %w", err)
	}
	if n, err = New(cfg); err != nil {
		return nil, nil, nil, err
	}
	stops = append(stops, n.Stop)
	pause, err := PauseImage(n.path("images"))
	if err != nil {
		return nil, nil, nil, err
	}
	n.cfg.Images = append([]Image{pause}, n.cfg.Images...)
	if cluster, err = harness.New(n.ClusterConfig(clusterCfg)); err != nil {
		return nil, nil, nil, err
	}
	if err := cluster.Start(ctx); err != nil {
		_ = cluster.Stop()
		return nil, nil, nil, err
	}
	// The node stops before the cluster: it drains its pods through it.
	stops = append(stops[:1], cluster.Stop, n.Stop)
	if err := n.Start(ctx, cluster); err != nil {
		return nil, nil, nil, fmt.Errorf("%w\n%s", err, n.Logs())
	}
	return n, cluster, stop, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
