// Command kube-controller-manager is the upstream controller manager, built
// from the k8s.io/kubernetes module at the API server's version: the node
// suite needs its Deployment, ReplicaSet, ServiceAccount, root-CA publisher
// and garbage-collection controllers.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
