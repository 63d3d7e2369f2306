// Command kube-proxy is the upstream kube-proxy, built from the
// k8s.io/kubernetes module at the API server's version: it routes the node
// suite's Service ClusterIPs (the API server's, the CA's) with iptables.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
