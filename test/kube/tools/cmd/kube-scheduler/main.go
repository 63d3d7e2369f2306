// Command kube-scheduler is the upstream scheduler, built from the
// k8s.io/kubernetes module at the API server's version: pods of a
// Deployment are bound to the node suite's node by it.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
