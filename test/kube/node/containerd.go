package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/harness"
)

// CNIBinDir is where Debian's containernetworking-plugins puts the plugins.
const CNIBinDir = "/usr/lib/cni"

func (n *Node) containerdSocket() string { return n.path("containerd/containerd.sock") }

// containerdConfig is config version 2 (containerd 1.6) with everything of
// the instance under the node's directory: root, state, the gRPC, ttrpc and
// debug sockets, runc's root (the default is the system containerd's
// /run/containerd/runc/k8s.io), the CNI config. restrict_oom_score_adj:
// without it every sandbox fails (runc cannot write oom_score_adj where the
// capability bounding set lacks CAP_SYS_RESOURCE). The pods' network
// namespaces are mounted under the state directory, not /var/run/netns.
// cgroupfs, as the kubelet.
func (n *Node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  address = %[5]q

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[6]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[7]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[8]q

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[9]q
    conf_dir = %[10]q
    max_conf_num = 1
`, n.path("containerd/root"), n.path("containerd/state"), n.containerdSocket(), n.containerdSocket()+".ttrpc",
		n.path("containerd/debug.sock"), n.path("containerd/opt"), DefaultPauseRef, n.path("runc"), CNIBinDir, n.path("cni"))
}

// cniConfig is a bridge network with host-local addresses kept under the
// node's directory, and the firewall plugin, which accepts the pods'
// traffic in iptables' FORWARD chain (Docker sets its policy to DROP).
// No masquerade: the pods talk to each other and to the node.
func (n *Node) cniConfig() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "meshid-node",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      n.cfg.Bridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": n.path("cni-data"),
					"ranges":  []any{[]any{map[string]any{"subnet": n.cfg.PodCIDR}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "firewall", "backend": "iptables"},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("node: cni config: %w", err)
	}
	return b, nil
}

// createBridge makes the CNI bridge before any pod, with a fixed MAC
// address: a Linux bridge whose address was never set takes the lowest of
// its ports' and changes it as pods join, under the pods' ARP entries for
// their gateway. The bridge plugin uses the bridge it finds.
func (n *Node) createBridge() error {
	for _, args := range [][]string{
		{"link", "add", n.cfg.Bridge, "type", "bridge"},
		{"link", "set", n.cfg.Bridge, "address", "02:6d:65:73:68:01"},
		{"link", "set", n.cfg.Bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("node: ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func (n *Node) startContainerd(ctx context.Context) error {
	if err := n.createBridge(); err != nil {
		return err
	}
	cni, err := n.cniConfig()
	if err != nil {
		return err
	}
	if err := writeFiles(map[string][]byte{
		n.path("containerd/config.toml"): []byte(n.containerdConfig()),
		n.path("cni/10-meshid.conflist"): cni,
	}); err != nil {
		return err
	}
	p, err := harness.StartProcess("containerd", "containerd", n.path("containerd.log"), nil,
		"--config", n.path("containerd/config.toml"), "--log-level", "info")
	if err != nil {
		return err
	}
	n.containerd = p
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	exited := p.Exited()
	err = wait.PollUntilContextCancel(wctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("node: containerd exited")
		default:
		}
		return exec.CommandContext(ctx, "ctr", "-a", n.containerdSocket(), "version").Run() == nil, nil
	})
	if err != nil {
		return fmt.Errorf("node: waiting for containerd: %w\ncontainerd log:\n%s", err, p.Tail(4096))
	}
	return nil
}
