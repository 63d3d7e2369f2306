package node

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/harness"
)

// startControlPlane starts kube-proxy, kube-scheduler and
// kube-controller-manager, each with the identity kubeadm gives it, so
// that RBAC judges them as in a cluster.
func (n *Node) startControlPlane() error {
	bin := func(name string) string { return filepath.Join(n.cfg.BinDir, name) }
	proxyKC, err := n.cluster.UserKubeconfig("kube-proxy", "system:kube-proxy", nil)
	if err != nil {
		return err
	}
	healthz, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	metrics, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	// iptables mode; --masquerade-all so that a reply from a pod on the
	// bridge comes back through the node whether or not bridged traffic
	// passes iptables; no conntrack sysctls (0 leaves them) and no
	// route_localnet (--iptables-localhost-nodeports=false).
	if n.proxy, err = harness.StartProcess("kube-proxy", bin("kube-proxy"), n.path("kube-proxy.log"), nil,
		"--kubeconfig="+proxyKC,
		"--hostname-override="+Name,
		"--proxy-mode=iptables",
		"--cluster-cidr="+n.cfg.PodCIDR,
		"--masquerade-all",
		"--iptables-localhost-nodeports=false",
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--healthz-bind-address="+healthz,
		"--metrics-bind-address="+metrics,
		"--v=1",
	); err != nil {
		return err
	}
	schedKC, err := n.cluster.UserKubeconfig("kube-scheduler", "system:kube-scheduler", nil)
	if err != nil {
		return err
	}
	if n.scheduler, err = harness.StartProcess("kube-scheduler", bin("kube-scheduler"), n.path("kube-scheduler.log"), nil,
		"--kubeconfig="+schedKC,
		"--authentication-kubeconfig="+schedKC,
		"--authorization-kubeconfig="+schedKC,
		"--secure-port=0",
		"--leader-elect=false",
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--v=1",
	); err != nil {
		return err
	}
	kcmKC, err := n.cluster.UserKubeconfig("kube-controller-manager", "system:kube-controller-manager", nil)
	if err != nil {
		return err
	}
	if n.controllerManager, err = harness.StartProcess("kube-controller-manager", bin("kube-controller-manager"), n.path("kube-controller-manager.log"), nil,
		"--kubeconfig="+kcmKC,
		"--authentication-kubeconfig="+kcmKC,
		"--authorization-kubeconfig="+kcmKC,
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--root-ca-file="+filepath.Join(n.cluster.Dir(), "ca.crt"),
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--v=1",
	); err != nil {
		return err
	}
	return nil
}

// stopControlPlane stops the controller manager and the scheduler (first:
// nothing recreates the pods Stop deletes) and kube-proxy.
func (n *Node) stopControlPlane() error {
	var errs []error
	for _, p := range []*harness.Process{n.controllerManager, n.scheduler, n.proxy} {
		if p != nil {
			errs = append(errs, p.Stop(10e9))
		}
	}
	return errors.Join(errs...)
}

// ProxyLog is the end of kube-proxy's log.
func (n *Node) ProxyLog() string { return n.proxy.Tail(4000) }

// Logs are the ends of every process's log, for failure output.
func (n *Node) Logs() string {
	var s string
	for _, p := range []struct {
		name string
		p    *harness.Process
	}{{"containerd", n.containerd}, {"kubelet", n.kubelet}, {"kube-controller-manager", n.controllerManager}, {"kube-scheduler", n.scheduler}, {"kube-proxy", n.proxy}} {
		if p.p != nil {
			s += fmt.Sprintf("--- %s\n%s\n", p.name, p.p.Tail(3000))
		}
	}
	return s
}

// WaitServiceRouted waits until kube-proxy routes the Service at
// clusterIP:port to an endpoint: its nat rule jumping to the Service's
// chain (KUBE-SVC-…) is in KUBE-SERVICES. A connection opened before that
// is not translated, and stays so for its conntrack entry's life: its SYN
// retries go nowhere and it times out, even once the rule exists.
func (n *Node) WaitServiceRouted(ctx context.Context, clusterIP string, port int32) error {
	want := fmt.Sprintf("-d %s/32 -p tcp", clusterIP)
	dport := fmt.Sprintf("--dport %d", port)
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := exec.CommandContext(ctx, "iptables", "-t", "nat", "-S", "KUBE-SERVICES").Output()
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, want) && strings.Contains(line, dport) && strings.Contains(line, "-j KUBE-SVC-") {
				return true, nil
			}
		}
		last = string(out)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node: kube-proxy does not route %s:%d: %w\n%s\nkube-proxy:\n%s", clusterIP, port, err, last, n.ProxyLog())
	}
	return nil
}
