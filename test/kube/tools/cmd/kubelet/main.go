// Command kubelet is the upstream kubelet, built from the k8s.io/kubernetes
// module at the API server's version, so the node suite needs no prebuilt
// download.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
