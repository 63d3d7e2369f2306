package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/harness"
)

// Name is the node's name. The API server reaches a node by its name (logs,
// exec); "localhost" resolves on every machine, and the kubelet serves on
// 127.0.0.1 with a certificate for it.
const Name = "localhost"

// Defaults of Config.
const (
	DefaultPodCIDR   = "10.244.0.0/16"
	DefaultBridge    = "meshid0"
	DefaultPauseRef  = "meshid.test/pause:1"
	defaultReadyWait = 2 * time.Minute
)

// Config describes the node.
type Config struct {
	// BinDir holds kubelet, kube-controller-manager, kube-scheduler and
	// kube-proxy; empty means harness.BinDir.
	BinDir string
	// Dir is where everything of the node goes; empty means a new
	// directory under /tmp, removed by Stop. Unix socket paths live under
	// it, so keep it short.
	Dir string
	// PodCIDR is the bridge network's range (host-local IPAM); empty means
	// DefaultPodCIDR.
	PodCIDR string
	// Bridge is the CNI bridge's interface name; empty means DefaultBridge.
	Bridge string
	// HostIP is the node's InternalIP, where the API server is advertised
	// for pods (the "kubernetes" Service's endpoint); empty means the
	// address of the default route's interface.
	HostIP string
	// Images are imported into containerd before the kubelet starts; the
	// pause image (DefaultPauseRef) must be one of them.
	Images []Image
	// ReadyTimeout bounds the wait for the node to be Ready; 0 means 2 min.
	ReadyTimeout time.Duration
	Logger       *slog.Logger
}

// Node is a running containerd, kubelet, kube-controller-manager,
// kube-scheduler and kube-proxy.
type Node struct {
	cfg       Config
	dir       string
	removeDir bool
	pki       *nodePKI
	cluster   *harness.Cluster
	log       *slog.Logger

	containerd, kubelet, controllerManager, scheduler, proxy *harness.Process
}

// New validates cfg and writes the node's key material, so that
// APIServerArgs can be given to the cluster before it starts. It starts
// nothing; call Start with the running cluster.
func New(cfg Config) (*Node, error) {
	if cfg.PodCIDR == "" {
		cfg.PodCIDR = DefaultPodCIDR
	}
	if _, _, err := net.ParseCIDR(cfg.PodCIDR); err != nil {
		return nil, fmt.Errorf("node: PodCIDR: %w", err)
	}
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if len(cfg.Bridge) > 15 {
		return nil, fmt.Errorf("node: bridge name %q is longer than 15 bytes", cfg.Bridge)
	}
	if cfg.HostIP == "" {
		ip, err := utilnet.ChooseHostInterface()
		if err != nil {
			return nil, fmt.Errorf("node: no host address for the node (set HostIP): %w", err)
		}
		cfg.HostIP = ip.String()
	}
	if ip := net.ParseIP(cfg.HostIP); ip == nil || ip.IsLoopback() {
		return nil, fmt.Errorf("node: HostIP %q is not a non-loopback address", cfg.HostIP)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = defaultReadyWait
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.BinDir == "" {
		dir, err := harness.BinDir()
		if err != nil {
			return nil, err
		}
		cfg.BinDir = dir
	}
	for _, b := range []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("node: %s missing in %s (run test/kube/hack/build-binaries.sh): %w", b, cfg.BinDir, err)
		}
	}
	n := &Node{cfg: cfg, dir: cfg.Dir, log: cfg.Logger}
	if n.dir == "" {
		dir, err := os.MkdirTemp("", "meshid-node-")
		if err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		n.dir, n.removeDir = dir, true
	}
	p, err := newNodePKI(time.Now())
	if err != nil {
		return nil, err
	}
	n.pki = p
	for _, d := range []string{"pki", "containerd", "cni", "cni-data", "kubelet", "pod-logs", "runc", "images"} {
		if err := os.MkdirAll(n.path(d), 0o700); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	if err := writeFiles(map[string][]byte{
		n.path("pki/ca.crt"):                p.caPEM,
		n.path("pki/kubelet.crt"):           p.servingPEM,
		n.path("pki/kubelet.key"):           p.servingKey,
		n.path("pki/apiserver-kubelet.crt"): p.apiClientPEM,
		n.path("pki/apiserver-kubelet.key"): p.apiClient,
	}); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Node) path(name string) string { return filepath.Join(n.dir, name) }

// Dir is the node's directory (logs, configs, the kubelet's root).
func (n *Node) Dir() string { return n.dir }

// HostIP is the node's InternalIP.
func (n *Node) HostIP() string { return n.cfg.HostIP }

// ClusterConfig returns cfg with what the API server needs to run beside
// this node: Node authorization and NodeRestriction, ServiceAccount
// admission (pods get their service account's API token), the kubelet
// client credentials (logs, exec), and the "kubernetes" Service's endpoint
// on the node's address, where pods reach it through kube-proxy. The API
// server then listens on every address, not only loopback.
func (n *Node) ClusterConfig(cfg harness.Config) harness.Config {
	cfg.NodeAuthorization = true
	cfg.ServiceAccountAdmission = true
	cfg.ExtraArgs = append(append([]string(nil), cfg.ExtraArgs...),
		"--kubelet-client-certificate="+n.path("pki/apiserver-kubelet.crt"),
		"--kubelet-client-key="+n.path("pki/apiserver-kubelet.key"),
		"--kubelet-certificate-authority="+n.path("pki/ca.crt"),
		"--bind-address=0.0.0.0",
		"--advertise-address="+n.cfg.HostIP,
		"--endpoint-reconciler-type=lease",
	)
	return cfg
}

// Start starts containerd, the kubelet, kube-proxy, kube-scheduler and
// kube-controller-manager against cluster (started with ClusterConfig),
// and waits until the node is Ready. The caller holds the machine's lock
// (Lock) and stops the node (Stop) even when Start fails.
func (n *Node) Start(ctx context.Context, cluster *harness.Cluster) error {
	n.cluster = cluster
	if err := n.bindKubeletClient(ctx); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	for _, img := range n.cfg.Images {
		if err := n.ImportImage(img); err != nil {
			return err
		}
	}
	if err := n.startControlPlane(); err != nil {
		return err
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	return n.waitReady(ctx)
}

// bindKubeletClient lets the API server's kubelet client use the kubelet's
// API (the kubelet asks the API server with a SubjectAccessReview), as
// kubeadm's binding does.
func (n *Node) bindKubeletClient(ctx context.Context) error {
	_, err := n.cluster.Client().RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "meshid-test:apiserver-kubelet-client"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: apiserverKubeletUser}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("node: kubelet client binding: %w", err)
	}
	return nil
}

// waitReady waits until the Node object says Ready.
func (n *Node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ReadyTimeout)
	defer cancel()
	exited := n.kubelet.Exited()
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, errors.New("node: the kubelet exited")
		default:
		}
		node, err := n.cluster.Client().CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return Ready(node), nil
	})
	if err != nil {
		return fmt.Errorf("node: waiting for node %s to be Ready: %w\nkubelet log:\n%s", Name, err, n.kubelet.Tail(6000))
	}
	n.log.Info("node ready", "node", Name)
	return nil
}

// Ready reports whether node's Ready condition is True.
func Ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// KubeletLog, ContainerdLog: the ends of their logs, for failure output.
func (n *Node) KubeletLog() string    { return n.kubelet.Tail(8192) }
func (n *Node) ContainerdLog() string { return n.containerd.Tail(8192) }
