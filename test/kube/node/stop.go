package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Stop removes every pod through the kubelet (so that it tears down their
// volumes, networks and cgroups as in a cluster), stops every process, and
// cleans what is left (Clean). It is safe to call more than once and after
// a failed Start.
func (n *Node) Stop() error {
	var errs []error
	errs = append(errs, n.stopControlPlane())
	if n.kubelet != nil && n.kubelet.Running() && n.cluster != nil {
		errs = append(errs, n.drain())
	}
	for _, p := range []struct {
		stop func() error
	}{
		{func() error {
			if n.kubelet == nil {
				return nil
			}
			return n.kubelet.Stop(30 * time.Second)
		}},
		{func() error {
			if n.containerd == nil {
				return nil
			}
			return n.containerd.Stop(30 * time.Second)
		}},
	} {
		errs = append(errs, p.stop())
	}
	errs = append(errs, n.cleaner().run())
	if n.removeDir {
		errs = append(errs, os.RemoveAll(n.dir))
	}
	return errors.Join(errs...)
}

// drain deletes every pod at once (no grace) and waits, at most two
// minutes, until the kubelet has removed their cgroups. A kubelet too slow
// for that (100 pods on a busy machine) is not an error: the cleaner
// removes what it left.
func (n *Node) drain() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := n.cluster.Client()
	nss, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	zero := int64(0)
	for _, ns := range nss.Items {
		_ = c.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		return podCgroups() == 0, nil
	})
	if err != nil {
		n.log.Warn("the kubelet had not removed every pod; cleaning up after it", "pods", podCgroups())
	}
	return nil
}

// podCgroups counts the pods' cgroups the kubelet keeps (pod<uid>
// directories under kubepods, in the pids hierarchy or the unified one).
func podCgroups() int {
	count := 0
	for _, root := range kubepodsDirs() {
		if !strings.Contains(root, "/pids/") && root != "/sys/fs/cgroup/kubepods" {
			continue
		}
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), "pod") {
				count++
				return filepath.SkipDir
			}
			return nil
		})
	}
	return count
}

func (n *Node) cleaner() cleaner {
	return cleaner{
		marks:     []string{n.dir + "/"},
		bridge:    n.cfg.Bridge,
		kubeProxy: filepath.Join(n.cfg.BinDir, "kube-proxy"),
	}
}

// waitTick is the pause between two checks that a killed process is gone.
func waitTick() { <-time.After(10 * time.Millisecond) }
