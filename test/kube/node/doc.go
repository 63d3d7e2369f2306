// Package node runs a real Kubernetes node beside the harness's control
// plane: containerd (its own instance, config, root, state and sockets under
// the test's directory), the kubelet (node "localhost", serving on
// 127.0.0.1), kube-controller-manager, kube-scheduler and kube-proxy, all
// built from the pinned Kubernetes module by hack/build-binaries.sh, with
// Debian's runc and CNI plugins (bridge, host-local, firewall). Images are
// written as docker-save tarballs by ImageTar and imported into the node's
// containerd, so no registry and no Docker are needed.
//
// A node needs root, and only one fits on a machine (the kubelet's ports and
// the kubepods cgroups): Boot takes a machine-wide lock, refuses to run
// without root with an error that says so, and cleans what an earlier run
// left (mounts, cgroups, the bridge, kube-proxy's rules) before it starts.
// Stop removes every pod through the kubelet and then cleans the same way.
package node
