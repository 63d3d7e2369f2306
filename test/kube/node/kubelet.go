package node

import (
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/meshid/meshid/test/kube/harness"
)

// kubeletConfig is the KubeletConfiguration of a node on a machine that
// is shared and not built for it: cgroup v1 and swap allowed, cgroupfs,
// the node's own containerd, serving on 127.0.0.1 with x509 and webhook
// authentication (no anonymous access, no read-only port), webhook
// authorization, and eviction and image GC thresholds loose enough that a
// busy disk does not evict the suite's pods or its images.
func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %[1]q
tlsPrivateKeyFile: %[2]q
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[3]q
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%[4]s
podLogsDir: %[5]q
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
maxPods: 250
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 24h
syncFrequency: 10s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
`, n.path("pki/kubelet.crt"), n.path("pki/kubelet.key"), n.path("pki/ca.crt"), n.containerdSocket(), n.path("pod-logs"))
}

func (n *Node) startKubelet() error {
	kubeconfig := n.path("kubelet.kubeconfig")
	if err := writeKubeconfig(kubeconfig, n.cluster.NodeConfig(Name)); err != nil {
		return err
	}
	if err := writeFiles(map[string][]byte{n.path("kubelet-config.yaml"): []byte(n.kubeletConfig())}); err != nil {
		return err
	}
	p, err := harness.StartProcess("kubelet", filepath.Join(n.cfg.BinDir, "kubelet"), n.path("kubelet.log"), nil,
		"--config="+n.path("kubelet-config.yaml"),
		"--kubeconfig="+kubeconfig,
		"--root-dir="+n.path("kubelet"),
		"--cert-dir="+n.path("pki"),
		"--hostname-override="+Name,
		"--node-ip="+n.cfg.HostIP,
		"--v=1",
	)
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

// StopKubelet stops the kubelet and leaves its pods running, as a kubelet
// restart or crash does.
func (n *Node) StopKubelet() error { return n.kubelet.Stop(30 * time.Second) }

// StartKubelet starts the kubelet again after StopKubelet.
func (n *Node) StartKubelet() error { return n.startKubelet() }

// writeKubeconfig writes a kubeconfig file for cfg's host, CA and client
// certificate.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["harness"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["harness"] = &clientcmdapi.Context{Cluster: "harness", AuthInfo: "user"}
	kc.CurrentContext = "harness"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("node: kubeconfig: %w", err)
	}
	return nil
}

// ProjectedVolumeDir is where the kubelet writes the projected volume
// name of the pod with uid: the files its containers see, bind-mounted.
func (n *Node) ProjectedVolumeDir(uid, name string) string {
	return filepath.Join(n.path("kubelet"), "pods", uid, "volumes", "kubernetes.io~projected", name)
}
